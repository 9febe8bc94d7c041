"""An outage of the audit database, as the log tells it: one line when it starts and one when it
ends, per process, however many turns of how many duties fail in between.

Every periodic duty needs the database; each logging its own failure every turn buried the one
line that said what had happened. The store's boundary map tells ``OUTAGE`` of an unreachable
database, which logs the first failure; the first statement that succeeds after it logs the end
and how long it lasted (monotonic). While the duties run, ``SaidOnce`` drops a duty's failed-turn
line whose error *is* that outage. Any other failure, and any line about one action, still logs.
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
        return self.since is None

    def failed(self, why: str) -> None:
        """Note that the database could not be reached; the first failure of an outage logs."""
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
        """Note a statement that succeeded (cheap while up); the first after an outage logs."""
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
        """Report outages in the block, dropping the log records that only repeat one."""
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
    """Whether ``record``'s error is the database being unreachable; one it caused (an
    interrupted reset, a lost lease) is news of its own."""
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
    """Drop a duty's failed-turn record (``errors.DUTY_TURN``) that only repeats a said outage;
    a record about one action is news of its own and always logs."""

    def __init__(self, outage: Outage) -> None:
        super().__init__()
        self.outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        duty = getattr(record, "duty_outage", False) is True
        return not (duty and not self.outage.up() and carries_unreachable(record))


OUTAGE = Outage(log)  # the process's one outage reporter (the log is the process's)
