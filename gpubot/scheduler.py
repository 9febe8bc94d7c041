"""Schedules (the sweep, the audit head's publication, the approval expiry, the claims): each
periodic duty runs on the monotonic clock.

A wall-clock scheduler (APScheduler 3 keeps next-run times as wall datetimes) stops every duty
for the size of a step back: after an NTP correction of an hour, or a VM snapshot restored,
nothing would sweep, expire or serve the queue for an hour, and nothing would say why. Here
the next run is a monotonic deadline (``Clock.monotonic``, slept on with ``Clock.sleep``: the
event loop's own clock in production, a virtual one in tests), so the wall clock cannot move
it. Before each run the clock's ``Steps`` looks for a step of the wall clock (logged once,
whichever duty sees it first; ``core.clock``).

A run never overlaps the previous one: runs due while one is still going are folded into the
next interval. The job's own failures are logged, never fatal to the bot.

A stop waits for the run under way, not for the schedule: the loop would sleep a whole
interval after the run before it looked again, and every stop would then last its full
``stop_wait_s``. The app stops its schedules one after another, so those waits would add up
past systemd's ``TimeoutStopSec`` and the SIGKILL would lose the clean stop's seal.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from gpubot.core.clock import SYSTEM_CLOCK, steps_of
from gpubot.core.ports import Clock

log = logging.getLogger(__name__)


class IntervalScheduler:
    """Runs ``job`` every ``interval_s`` seconds (monotonic) on the running loop, never twice
    at once."""

    def __init__(
        self,
        job: Callable[[], Awaitable[Any]],
        interval_s: float,
        *,
        first_after_s: float | None = None,
        stop_wait_s: float = 30.0,
        name: str = "sweep",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``first_after_s``: delay of the first run (default: a few seconds after start)."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.name = name
        self.job = job
        self.interval_s = interval_s
        self.first_after_s = min(5.0, interval_s) if first_after_s is None else first_after_s
        self.stop_wait_s = stop_wait_s
        self.clock = clock
        self.runs = 0  # runs started by this scheduler
        self._task: asyncio.Task[None] | None = None  # the schedule's loop
        self._run_task: asyncio.Task[None] | None = None  # the run under way, if any

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._loop(), name=f"gpubot-{self.name}")

    async def _loop(self) -> None:
        steps = steps_of(self.clock)
        due = self.clock.monotonic() + self.first_after_s
        while True:
            await self.clock.sleep(max(0.0, due - self.clock.monotonic()))
            if not self.running:  # stopped while it slept
                return
            steps.check()  # a step of the wall clock is seen here: it moves no deadline
            run = asyncio.get_running_loop().create_task(
                self._run(), name=f"gpubot-{self.name}-run"
            )
            self._run_task = run
            try:
                await asyncio.shield(run)  # a stop cancels the loop; the run may finish
            finally:
                self._run_task = None
            due = self.next_due(due, self.clock.monotonic())

    def next_due(self, due: float, now: float) -> float:
        """Return the run after the one due at ``due``: one interval on, or, when runs were
        missed (a long run, a busy loop), the first interval boundary after ``now``."""
        nxt = due + self.interval_s
        if nxt > now:
            return nxt
        return due + self.interval_s * (math.floor((now - due) / self.interval_s) + 1)

    async def _run(self) -> None:
        self.runs += 1
        try:
            await self.job()
        except Exception:
            log.exception("the %s failed", self.name)

    async def stop(self) -> None:
        """Stop the schedule at once; a run under way may finish (up to ``stop_wait_s`` on the
        schedule's clock), and is cancelled if it does not."""
        task, self._task = self._task, None
        if task is None:
            return
        run = self._run_task
        task.cancel()  # sleeping, or waiting on the run through a shield: ends now
        with suppress(asyncio.CancelledError):
            await task
        if run is None or run.done():
            return
        timer = asyncio.ensure_future(self.clock.sleep(self.stop_wait_s))
        try:
            await asyncio.wait({run, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if run.done():
            return
        log.warning(
            "the %s outlasted the stop's wait of %g s: cancelled", self.name, self.stop_wait_s
        )
        run.cancel()
        with suppress(asyncio.CancelledError):
            await run
