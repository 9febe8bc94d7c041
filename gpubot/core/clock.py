"""The system clock: the default ``Clock`` (``core.ports``) of every service."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class SystemClock:
    """Wall time, monotonic time and sleeping, from the operating system."""

    def now(self) -> float:
        """Return unix time in seconds."""
        return time.time()

    def monotonic(self) -> float:
        """Return a monotonic time in seconds (for deadlines and durations)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (yielding to the event loop)."""
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """Await ``aw`` for at most ``seconds`` (None: no limit); raise ``TimeoutError`` after.

    Every bounded wait in gpubot goes through here rather than ``asyncio.wait_for``: on Python
    3.11, ``wait_for`` loses a cancellation that arrives just as ``aw`` finishes (CPython
    gh-86296, fixed in 3.12). It returns ``aw``'s result or raises its error instead, and a
    loop cancelled at shutdown then never ends."""
    async with asyncio.timeout(seconds):
        return await aw


PAUSE_S = 0.0002  # long enough for a thread waiting for the interpreter lock to take it


def let_loop_in() -> None:
    """Sleep ``PAUSE_S``: the interpreter lock is free long enough for the event loop's thread
    to take it if it waits for it (issue 24)."""
    time.sleep(PAUSE_S)


class HandOver:
    """Lets the event loop in after ``run_s`` of a worker thread's work (issue 24).

    A worker calls ``before`` and ``after`` around each piece of its work (a job, a database
    statement). Once pieces one after another (less than ``run_s`` apart) have run for
    ``run_s``, ``before`` lets the loop in (``let_loop_in``). A longer gap (the thread had
    nothing to do, and held no lock) starts a new run. The main thread never pauses: it is the
    loop's own, or a command's only one.

    CPython hands the lock over on its own only after the waiter has waited its switch
    interval (5 ms) with no release in between. A thread that keeps the lock busy makes the
    loop wait up to 5 ms after each of its system calls (a socket send: the pure-work thread,
    ``services.offload``), or without end if that thread itself releases and takes the lock
    back (each database statement: the store's threads, ``store.waits``).
    """

    def __init__(self, run_s: float) -> None:
        self.run_s = run_s
        self._runs = threading.local()  # each thread's (start of its run, end of its last piece)

    def before(self) -> None:
        """Before a piece of work: let the loop in if this thread's run is ``run_s`` long."""
        if threading.current_thread() is threading.main_thread():
            return
        now = time.perf_counter()
        first, end = getattr(self._runs, "span", (now, now))
        if now - end > self.run_s:
            first = now
        elif now - first >= self.run_s:
            let_loop_in()
            first = time.perf_counter()
        self._runs.span = (first, end)

    def after(self) -> None:
        """After a piece of work: the run goes on from here."""
        first = getattr(self._runs, "span", (0.0, 0.0))[0]
        self._runs.span = (first, time.perf_counter())
