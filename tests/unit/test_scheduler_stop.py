"""A schedule's stop waits for the run under way, not for the schedule (the review of issue
34's duties): the app stops its schedules one after another, and a stop that always waited
its whole ``stop_wait_s`` would add up past systemd's ``TimeoutStopSec``. A virtual clock
moves time; nothing sleeps for real."""

from __future__ import annotations

import asyncio

import pytest

from gpubot.scheduler import IntervalScheduler
from tests.fixtures.clock import VirtualClock


class Job:
    """A run that lasts ``length_s`` on the clock and says whether it finished or was cut."""

    def __init__(self, clock: VirtualClock, length_s: float) -> None:
        self.clock, self.length_s = clock, length_s
        self.finished = self.cancelled = 0

    async def __call__(self) -> None:
        try:
            await self.clock.sleep(self.length_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1


def _schedule(clock: VirtualClock, job: Job) -> IntervalScheduler:
    return IntervalScheduler(job, 60, first_after_s=0, stop_wait_s=3, name="sweep", clock=clock)


async def test_a_stop_during_a_run_returns_as_soon_as_the_run_ends() -> None:
    clock = VirtualClock()
    job = Job(clock, 0.3)
    s = _schedule(clock, job)
    s.start()
    await clock.advance(0)  # the first run starts
    assert s.runs == 1
    stop = asyncio.ensure_future(s.stop())
    await clock.settle()
    assert not stop.done()  # the run may finish
    await clock.advance(0.3)  # the run ends
    # The control (the old stop): it waited on the loop, which slept the interval (60 s)
    # after the run before it looked again, and so waited all of stop_wait_s.
    assert stop.done(), "the stop waits past the end of the run"
    await stop
    assert job.finished == 1 and job.cancelled == 0
    assert clock.monotonic() == pytest.approx(0.3) and not s.running


async def test_a_stop_while_the_schedule_sleeps_returns_at_once() -> None:
    clock = VirtualClock()
    job = Job(clock, 0.3)
    s = _schedule(clock, job)
    s.start()
    await clock.advance(10)  # a run at 0, then asleep until 60
    assert s.runs == 1 and job.finished == 1
    stop = asyncio.ensure_future(s.stop())
    await clock.settle()
    assert stop.done()
    await stop
    await clock.advance(120)
    assert s.runs == 1 and not s.running  # nothing runs after the stop


async def test_a_run_that_outlasts_the_stop_wait_is_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    job = Job(clock, 100)
    s = _schedule(clock, job)
    s.start()
    await clock.advance(1)  # the run is under way
    stop = asyncio.ensure_future(s.stop())
    await clock.advance(2.9)
    assert not stop.done()  # within stop_wait_s (3 s): the run may still finish
    await clock.advance(0.1)
    assert stop.done(), "the stop outlives its wait"
    await stop
    assert job.cancelled == 1 and job.finished == 0
    assert any("outlasted the stop's wait of 3 s" in r.getMessage() for r in caplog.records)


async def test_a_stop_before_the_first_run_and_a_second_stop_return_at_once() -> None:
    clock = VirtualClock()
    job = Job(clock, 0.3)
    s = _schedule(clock, job)
    await s.stop()  # never started
    s.start()
    await s.stop()
    await s.stop()
    await clock.advance(120)
    assert s.runs == 0 and not s.running
