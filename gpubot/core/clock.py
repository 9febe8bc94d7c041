"""The system clock: the default ``Clock`` (``core.ports``) of every service, and the one place
that notices the wall clock stepping (``Steps``, ``steps_of``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from gpubot.core.ports import Clock

T = TypeVar("T")

log = logging.getLogger(__name__)


class SystemClock:
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


class Steps:
    """Watches one clock for steps of its wall time (wall delta against monotonic delta).

    Every duty looks before it runs, so a step is logged once, by whichever looks first. A
    deadline stored in wall time is judged by ``expiry_now``, which follows a step back at once
    but a step forward only at the monotonic pace until the step has held ``SETTLE_S``.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.settle_s = SETTLE_S
        self._look: tuple[float, float] | None = None  # (wall, mono) of the previous look
        self._ahead: tuple[float, float, float] | None = None  # forward: anchor wall, mono, seen
        self._behind: tuple[float, float, float] | None = None  # back: the same (``latest_now``)

    def check(self) -> float | None:
        """Look at the clock; return (and log, once) a step since the previous look (seconds,
        negative: back)."""
        wall, mono = self.clock.now(), self.clock.monotonic()
        prev, self._look = self._look, (wall, mono)
        if prev is None:
            return None
        step = (wall - prev[0]) - (mono - prev[1])
        if abs(step) <= STEP_TOLERANCE_S:
            return None
        corrected = False
        if step > 0 and self._ahead is None:
            self._ahead = (prev[0], prev[1], mono)  # project from the last look before it
        elif (
            step < 0
            and self._ahead is not None
            and wall <= _projected(self._ahead, mono) + STEP_TOLERANCE_S
        ):
            self._ahead, corrected = None, True  # corrected: the wall clock is back in line
        # The time before a step back is kept, carried on monotonically, until a step forward.
        if step < 0 and not corrected:
            anchor = self._behind or (prev[0], prev[1], mono)
            self._behind = (anchor[0], anchor[1], mono)  # a further step: held from this one
        elif (
            step > 0
            and self._behind is not None
            and wall >= _projected(self._behind, mono) - STEP_TOLERANCE_S
        ):
            self._behind = None
        log.warning(
            "the wall clock stepped %s by %.0f s: periodic duties keep their interval; "
            "claims, holds and approvals end only when the monotonic clock agrees",
            "forward" if step > 0 else "back",
            abs(step),
        )
        return step

    def expiry_now(self) -> float:
        """Return the wall time to judge deadlines by: the earlier of the wall clock and, while
        a forward step has held less than ``SETTLE_S``, the time before it carried on."""
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
