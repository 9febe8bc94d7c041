"""Schedules (the sweep, the audit head's publication): APScheduler 3's ``AsyncIOScheduler``,
the only module importing it.

One interval job runs on the running event loop. ``max_instances=1`` means a run never overlaps
the previous one (a run due while one is still going is skipped); ``coalesce`` folds runs missed
while the loop was busy into one; ``misfire_grace_time`` lets a late run still happen within an
interval. The job's own failures are logged, never fatal to the bot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = logging.getLogger(__name__)


class IntervalScheduler:
    """Runs ``job`` every ``interval_s`` seconds on the running loop, never twice at once."""

    def __init__(
        self,
        job: Callable[[], Awaitable[Any]],
        interval_s: float,
        *,
        first_after_s: float | None = None,
        stop_wait_s: float = 30.0,
        name: str = "sweep",
    ) -> None:
        """``first_after_s``: delay of the first run (default: a few seconds after start)."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.name = name
        self.job = job
        self.interval_s = interval_s
        self.first_after_s = min(5.0, interval_s) if first_after_s is None else first_after_s
        self.stop_wait_s = stop_wait_s
        self.runs = 0  # runs started by this scheduler
        self._scheduler: AsyncIOScheduler | None = None
        self._running: asyncio.Task[Any] | None = None

    @property
    def running(self) -> bool:
        """Whether the schedule is started."""
        return self._scheduler is not None

    def start(self) -> None:
        """Start the schedule on the running event loop."""
        if self._scheduler is not None:
            return
        scheduler = AsyncIOScheduler(timezone=UTC)
        scheduler.add_job(
            self._run,
            "interval",
            seconds=self.interval_s,
            id=f"gpubot-{self.name}",
            name=self.name,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(self.interval_s)),
            next_run_time=datetime.now(UTC) + timedelta(seconds=self.first_after_s),
        )
        scheduler.start()
        self._scheduler = scheduler

    async def _run(self) -> None:
        if self._scheduler is None:
            # The executor may have created this run's task just before ``stop``: a stopped
            # schedule starts nothing (seen on a busy box: a sweep began after stop returned).
            return
        self.runs += 1
        self._running = asyncio.current_task()
        try:
            await self.job()
        except Exception:
            log.exception("the %s failed", self.name)
        finally:
            self._running = None

    async def stop(self) -> None:
        """Stop the schedule; a run under way may finish (up to ``stop_wait_s``)."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        scheduler.pause()
        task = self._running
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=self.stop_wait_s)
            if not done:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # AsyncIOScheduler shuts down through call_soon


SweepScheduler = IntervalScheduler  # the sweep's schedule (its default name)
