"""The system clock: the default ``Clock`` (``core.ports``) of every service, and the one place
that notices the wall clock stepping (``Steps``, ``steps_of``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from gpubot.core.ports import Clock

T = TypeVar("T")

log = logging.getLogger(__name__)


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

# Between two looks the wall and monotonic clocks may differ by NTP's slew (at most 0.5 ms a
# second) and by the moment between reading one and the other: a step is more than this.
STEP_TOLERANCE_S = 2.0
# How long a forward step must hold before expiry trusts it: a step that is corrected within
# this (a bad NTP server, a VM's clock before its agent fixes it) never ends a claim, a hold
# or an approval; one that stays (a real correction, a resumed VM) ends them this much late.
SETTLE_S = 600.0


@dataclass(frozen=True)
class Jump:
    """A step of the wall clock seen between two looks: ``step`` seconds (negative: back),
    ``wall`` and ``mono`` the look that saw it."""

    step: float
    wall: float
    mono: float


class Steps:
    """Watches one clock for steps of its wall time (wall delta against monotonic delta).

    Every periodic duty looks (``check``) before it runs, and expiry asks ``expiry_now``: so a
    step is seen, and logged, once, by whichever looks first. Durations and intervals never
    need it (they are monotonic); what is computed from wall time does: a deadline stored in
    wall time is judged by ``expiry_now``, which follows the wall clock back at once but
    forward only at the monotonic clock's pace until the step has held ``settle_s``.
    """

    def __init__(
        self, clock: Clock, tolerance_s: float = STEP_TOLERANCE_S, settle_s: float = SETTLE_S
    ) -> None:
        self.clock = clock
        self.tolerance_s = tolerance_s
        self.settle_s = settle_s
        self.jumps = 0  # steps seen
        self.last: Jump | None = None
        self._look: tuple[float, float] | None = None  # (wall, mono) of the previous look
        self._ahead: tuple[float, float, float] | None = None  # forward: anchor wall, mono, seen
        self._behind: tuple[float, float, float] | None = None  # back: the same (``latest_now``)

    def check(self) -> Jump | None:
        """Look at the clock; return (and log, once) a step since the previous look."""
        wall, mono = self.clock.now(), self.clock.monotonic()
        prev, self._look = self._look, (wall, mono)
        if prev is None:
            return None
        step = (wall - prev[0]) - (mono - prev[1])
        if abs(step) <= self.tolerance_s:
            return None
        jump = self.last = Jump(step, wall, mono)
        self.jumps += 1
        corrected = False
        if step > 0 and self._ahead is None:
            self._ahead = (prev[0], prev[1], mono)  # project from the last look before it
        elif (
            step < 0
            and self._ahead is not None
            and wall <= _projected(self._ahead, mono) + self.tolerance_s
        ):
            self._ahead, corrected = None, True  # corrected: the wall clock is back in line
        self._follow_back(step, prev, corrected)  # after ``_look`` is this look
        log.warning(
            "the wall clock stepped %s by %.0f s: periodic duties keep their interval; "
            "claims, holds and approvals end only when the monotonic clock agrees",
            "forward" if step > 0 else "back",
            abs(step),
        )
        return jump

    def _follow_back(self, step: float, prev: tuple[float, float], corrected: bool) -> None:
        """Keep (for ``latest_now``) the time before a step back, carried on by the monotonic
        clock, until a step forward puts the wall clock back in line with it."""
        assert self._look is not None
        wall, mono = self._look
        if step < 0 and not corrected:
            anchor = self._behind or (prev[0], prev[1], mono)
            self._behind = (anchor[0], anchor[1], mono)  # a further step: held from this one
        elif (
            step > 0
            and self._behind is not None
            and wall >= _projected(self._behind, mono) - self.tolerance_s
        ):
            self._behind = None

    def expiry_now(self) -> float:
        """Return the wall time to judge deadlines by: the wall clock, except while a forward
        step has held less than ``settle_s``, when it is the time before the step carried on
        by the monotonic clock (whichever is earlier)."""
        self.check()
        wall, mono = self._look or (self.clock.now(), self.clock.monotonic())
        if self._ahead is None:
            return wall
        if mono - self._ahead[2] >= self.settle_s:
            self._ahead = None  # it held: a real correction, or a resumed machine
            return wall
        return min(wall, _projected(self._ahead, mono))

    def latest_now(self, hold_s: float) -> float:
        """Return the wall time to judge by where running late is the danger (an approval's
        validity: ``services.approval_retry``): the wall clock, except for ``hold_s`` after a
        step back (the last of several), when it is the later of the wall clock and the time
        before the step carried on by the monotonic clock. What was valid before a step back
        is then valid no longer than it was; a step forward is followed at once."""
        self.check()
        wall, mono = self._look or (self.clock.now(), self.clock.monotonic())
        if self._behind is None:
            return wall
        if mono - self._behind[2] >= hold_s:
            self._behind = None  # it held: what was valid before it has ended by now
            return wall
        return max(wall, _projected(self._behind, mono))


def _projected(anchor: tuple[float, float, float], mono: float) -> float:
    """Return the wall time of ``anchor`` (wall, mono, seen) carried on to ``mono``."""
    wall, since, _ = anchor
    return wall + (mono - since)


_STEPS: weakref.WeakKeyDictionary[object, Steps] = weakref.WeakKeyDictionary()


def steps_of(clock: Clock) -> Steps:
    """Return the one ``Steps`` of ``clock``: every duty and service of a process shares it,
    so a step is logged once however many of them look."""
    steps = _STEPS.get(clock)
    if steps is None:
        steps = _STEPS[clock] = Steps(clock)
    return steps


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
