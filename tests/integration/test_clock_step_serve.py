"""A wall clock stepped back an hour under the app's lifecycle (issue 34): the real scheduler,
the real sweep service with its database locks and audit log, real seconds at short intervals.
The wall clock is injected (``SteppedClock``): the machine's own is never touched.

The sweeps keep their interval and the step is logged once. The control runs APScheduler 3
(what the schedules ran on before) with the same step: it stops for the hour.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, tzinfo
from pathlib import Path

import pytest
from apscheduler.schedulers import base as apscheduler_base
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpubot.app import Serving, build
from gpubot.config import load
from gpubot.core.clock import SystemClock

H = 3600.0
INTERVAL = 0.3


class SteppedClock(SystemClock):
    """The system's clock, with a wall time the test can step (monotonic time stays true)."""

    offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset


def _steps(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.getMessage().startswith("the wall clock stepped") for r in caplog.records)


async def test_a_step_back_under_serve_keeps_the_sweeps_going(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n\n'
        f"[sweep]\ninterval_s = {INTERVAL}\nbudget_s = 0.25\n\n"
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'
    )
    from gpubot.store import open_store

    init = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
    init.upgrade()
    init.close()
    serving = Serving(settle_heap=False, first_after_s=0)
    app = build(load(path), {}, need_store=True, serving=serving)
    clock = SteppedClock()
    assert app.store is not None
    store = app.store
    store.clock = lambda: datetime.fromtimestamp(clock.now(), UTC)  # the audit log's times
    app.sweep.clock = clock
    for s in app.schedulers:
        s.clock = clock
    sweeps = app.scheduler("sweep")
    assert sweeps is not None
    try:
        async with app.running():
            await asyncio.sleep(5 * INTERVAL)
            before = sweeps.runs
            clock.offset = -H  # NTP steps the wall clock back an hour
            # another replica's sweep, recorded just before the step: now an hour ahead
            store.clock = lambda: datetime.fromtimestamp(SystemClock().now(), UTC)
            await store.record_query(
                kind="sweep",
                actor="gpubot:B",
                source="schedule",
                nodes=["node3"],
                failed={},
                seconds=0.0,
            )
            store.clock = lambda: datetime.fromtimestamp(clock.now(), UTC)
            await asyncio.sleep(8 * INTERVAL)
            after = sweeps.runs - before
    finally:
        await app.close()
    assert before >= 3 and after >= 5  # every INTERVAL, before and after the step
    skipped = [r.getMessage() for r in caplog.records if "another replica swept" in r.getMessage()]
    assert skipped == []  # the sweep recorded an hour ahead does not stand in for this hour's
    assert _steps(caplog) == 1


class _SteppedDatetime(datetime):
    offset = 0.0

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _SteppedDatetime:
        t = datetime.now(tz) + __import__("datetime").timedelta(seconds=cls.offset)
        return cls.fromtimestamp(t.timestamp(), tz)


async def test_control_apscheduler_stops_for_the_size_of_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(apscheduler_base, "datetime", _SteppedDatetime)
    runs = 0

    async def job() -> None:
        nonlocal runs
        runs += 1

    scheduler = AsyncIOScheduler(timezone=UTC)
    scheduler.add_job(
        job, "interval", seconds=INTERVAL, max_instances=1, coalesce=True, misfire_grace_time=1
    )
    scheduler.start()
    try:
        await asyncio.sleep(4 * INTERVAL)
        before = runs
        _SteppedDatetime.offset = -H
        await asyncio.sleep(6 * INTERVAL)
        after = runs - before
    finally:
        scheduler.shutdown(wait=False)
        await asyncio.sleep(0)
    assert before >= 2
    assert after <= 1  # at most the run already timed before the step; then nothing for an hour
