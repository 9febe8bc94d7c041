"""The audit database's state, as the bot's log tells it: one line when it becomes unreachable
("audit database unreachable since …") and one when it answers again, however many turns of a
periodic duty fail in between. A duty that fails because the database is down is not a bug:
no traceback (anything else still gets one, from the duty's own handler).
"""

from __future__ import annotations

import logging
import time

import aiohttp
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped

from gpubot.core.timefmt import iso
from gpubot.errors import StoreError


class DatabaseState:
    """Remembers since when the audit database fails; logs only the changes."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        """``what``: what stops while the database is down (said once, in the first line)."""
        self.log = log
        self.what = what
        self.since: float | None = None  # unix time of the first failure; None: reachable

    def failed(self, exc: StoreError) -> None:
        """Note a failure; the first of an outage is logged, as one line."""
        if self.since is not None:
            return
        self.since = time.time()
        self.log.error(
            "audit database unreachable since %s: %s (%s until it is back)",
            iso(self.since),
            exc,
            self.what,
        )

    def answered(self) -> None:
        """Note a success; the first after an outage is logged, as one line."""
        if self.since is None:
            return
        down_s = time.time() - self.since
        self.log.warning(
            "audit database reachable again (unreachable since %s, for %.0f s)",
            iso(self.since),
            down_s,
        )
        self.since = None


class OneLineUnreachable(logging.Filter):
    """Drop the traceback from a library's log record of a Slack it cannot reach (bolt's Socket
    Mode "Failed to connect ... Retrying" logs one a try): the line says it; the rest is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError | TimeoutError | aiohttp.ClientError):
            record.exc_info = None
            record.exc_text = None
        return True


class NotForOperators(logging.Filter):
    """Drop bolt's lines that mean nothing to whoever runs gpubot: bolt reads SLACK_BOT_TOKEN
    itself and warns, at every start, that the client it is given wins; that client is built
    from the very same token. (A failure to start must be one line, not this line and then it.)"""

    NOISE = frozenset({warning_client_prioritized_and_token_skipped()})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.NOISE


def quiet_unreachable(logger: logging.Logger) -> logging.Logger:
    """Return ``logger`` with ``OneLineUnreachable`` and ``NotForOperators`` on it (once)."""
    for kind in (OneLineUnreachable, NotForOperators):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
    return logger
