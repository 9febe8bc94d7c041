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
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()

# Between two looks the clocks may differ by NTP's slew and the moment between reading one and
# the other: a step is more than this.
STEP_TOLERANCE_S = 2.0
# How long a forward step must hold before expiry trusts it: a step that is corrected within
# this (a bad NTP server, a VM's clock before its agent fixes it) never ends a claim, a hold
# or an approval; one that stays (a real correction, a resumed VM) ends them this much late.
SETTLE_S = 600.0


@dataclass(frozen=True)
class Jump:
    """A step of the wall clock between two looks (``step`` negative: back)."""

    step: float
    wall: float
    mono: float


class Steps:
    """Watches one clock for steps of its wall time (wall delta against monotonic delta).

    Every duty looks before it runs, so a step is logged once, by whichever looks first. A
    deadline stored in wall time is judged by ``expiry_now``, which follows a step back at once
    but a step forward only at the monotonic pace until the step has held ``settle_s``.
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
        """Keep the time before a step back, carried on monotonically, until a step forward."""
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
        """Return the wall time to judge deadlines by: the earlier of the wall clock and, while
        a forward step has held less than ``settle_s``, the time before it carried on."""
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
        validity): for ``hold_s`` after a step back, the later of the wall clock and the time
        before it carried on, so what was valid is valid no longer than it was."""
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
    """Return the one ``Steps`` of ``clock``, shared so a step is logged once."""
    steps = _STEPS.get(clock)
    if steps is None:
        steps = _STEPS[clock] = Steps(clock)
    return steps


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """Await ``aw`` for at most ``seconds`` (None: no limit), else ``TimeoutError``.

    Not ``asyncio.wait_for``: on 3.11 it loses a cancellation that arrives just as ``aw``
    finishes (CPython gh-86296), and a loop cancelled at shutdown then never ends."""
    async with asyncio.timeout(seconds):
        return await aw


PAUSE_S = 0.0002  # long enough for a thread waiting for the interpreter lock to take it


def let_loop_in() -> None:
    """Sleep ``PAUSE_S``, so the event loop's thread may take the interpreter lock."""
    time.sleep(PAUSE_S)


class HandOver:
    """Lets the event loop in after ``run_s`` of a worker thread's back-to-back work.

    CPython hands the interpreter lock over only after the waiter has waited a whole switch
    interval with no release in between: a busy worker makes the loop wait that long after each
    of its system calls, or without end if it releases and retakes the lock (each database
    statement). A gap longer than ``run_s`` starts a new run; the main thread never pauses.
    """

    def __init__(self, run_s: float) -> None:
        self.run_s = run_s
        self._runs = threading.local()  # each thread's (start of its run, end of its last piece)

    def before(self) -> None:
        """Let the loop in if this thread's run is ``run_s`` long."""
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
        first = getattr(self._runs, "span", (0.0, 0.0))[0]
        self._runs.span = (first, time.perf_counter())
