"""Slack out of reach, as the bot's log tells it: one line a try, never a traceback, and none of
bolt's lines that mean nothing to whoever runs gpubot. (An outage of the audit database is said
by the store itself: ``store.outage``.)
"""

from __future__ import annotations

import logging

import aiohttp
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped


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
    """Return ``logger`` with both filters on it (once)."""
    for kind in (OneLineUnreachable, NotForOperators):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
    return logger
