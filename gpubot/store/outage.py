"""An outage of the audit database, as the log tells it: one line when it starts and one when it
ends, per process, however many turns of how many duties fail in between (issue 34).

Every periodic duty (sweeps, GPU-hours, alerts, claims, the approvals' expiry, the audit head,
the outboxes ...) needs the database, and each used to log its own warning on every turn: a
20 s outage wrote 15-18 lines per replica, a traceback among them, beside the one line that
said what had happened. The store's one boundary map (``engine.guard``) knows a database that
cannot be reached (``engine.unreachable``): it raises ``DatabaseUnreachable`` and tells
``OUTAGE``, which says the first failure of an outage in one line; the first statement that
succeeds after it says the end, in one line, with how long it lasted (monotonic: a wall-clock
step does not stretch it). While ``App.running`` runs the duties, ``OUTAGE.watched`` puts
``SaidOnce`` on the log's handlers: a duty's line that its turn failed (``errors.DUTY_TURN``)
whose error *is* that unreachable database has been said already, and is dropped. A duty that
fails for any other reason, and any line about one action, logs as it always did.

Standard library only: ``App.running`` imports it, and so does the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from gpubot.core.timefmt import iso
from gpubot.errors import DatabaseUnreachable

log = logging.getLogger(__name__)


class Outage:
    """Since when the audit database cannot be reached, while watched; logs only the changes."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.wall = wall
        self.mono = mono
        self.watching = 0  # how many ``watched`` blocks are open (the duties run)
        self.since: float | None = None  # wall time of the outage's first failure; None: up
        self._started = 0.0  # monotonic time of that failure: how long it lasted
        self._lock = threading.Lock()  # store calls fail and succeed in several threads

    def up(self) -> bool:
        """Whether no outage is being reported now."""
        return self.since is None

    def failed(self, why: str) -> None:
        """Note that the database could not be reached (``why``: the store's one line); the
        first failure of an outage is logged."""
        if not self.watching or not self.up():
            return
        with self._lock:
            if not self.up():  # another thread said it first
                return
            since, self._started = self.wall(), self.mono()
            self.log.error(
                "audit database unreachable since %s: %s "
                "(duties that need it skip their turns until it is back)",
                iso(since),
                why,
            )
            self.since = since  # said: from now on the duties' lines only repeat it

    def answered(self) -> None:
        """Note a statement that succeeded (on every one: cheap while the database is up); the
        first after an outage is logged."""
        if self.up():
            return
        with self._lock:
            if self.since is None:  # another thread said it first
                return
            self.log.warning(
                "audit database reachable again after %.0f s (unreachable since %s)",
                self.mono() - self._started,
                iso(self.since),
            )
            self.since = None

    @contextmanager
    def watched(self, logger: logging.Logger | None = None) -> Iterator[None]:
        """Report outages in the block, and drop from ``logger``'s handlers (the root's) the
        records that only repeat one; restore both at the end."""
        handlers = list((logger or logging.getLogger()).handlers)
        said = SaidOnce(self)
        for handler in handlers:
            handler.addFilter(said)
        with self._lock:
            self.watching += 1
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(said)
            with self._lock:
                self.watching -= 1
                if not self.watching:
                    self.since = None


def carries_unreachable(record: logging.LogRecord) -> bool:
    """Whether ``record``'s error (its exception, or an argument of its message) is the audit
    database being unreachable. Only that error itself: one it caused (an interrupted reset,
    a lost lease) is news of its own."""
    errors: list[object] = []
    if record.exc_info and record.exc_info[1] is not None:
        errors.append(record.exc_info[1])
    args = record.args
    if isinstance(args, Mapping):
        errors.extend(args.values())
    elif isinstance(args, tuple):
        errors.extend(args)
    return any(isinstance(e, DatabaseUnreachable) for e in errors)


class SaidOnce(logging.Filter):
    """Drop a log record that only repeats an outage ``outage`` has said (``watched``): a
    periodic duty's line that its turn failed (marked ``errors.DUTY_TURN``) because the
    database is unreachable, while the outage's line stands for it. A record about one action
    (an approval whose end or wait cannot be recorded) is news of its own and always logs."""

    def __init__(self, outage: Outage) -> None:
        super().__init__()
        self.outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        duty = getattr(record, "duty_outage", False) is True
        return not (duty and not self.outage.up() and carries_unreachable(record))


OUTAGE = Outage(log)  # the process's one outage reporter (the log is the process's)
