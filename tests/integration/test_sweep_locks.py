"""Database leases (SQLite and PostgreSQL alike), the schedule, and the
replica rule of ``scheduled()``: one sweep at a time, one an interval."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpubot.app import build
from gpubot.config import load
from gpubot.errors import LockHeld, ResetRefused
from gpubot.scheduler import IntervalScheduler
from gpubot.services.reset import reset_lock as reset_lock_name
from gpubot.services.sweep import SWEEP_LOCK, SweepService
from gpubot.store.leases import DbLeases
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.procs import until


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with temp_database(str(request.param), tmp_path) as url:
        yield url


async def test_a_held_lock_is_refused_with_its_holder(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    a, b = DbLeases(engine, replica="hostA:1"), DbLeases(engine, replica="hostB:2")
    try:
        async with a.hold(reset_lock_name("node3"), holder="slack:U0BOB"):
            with pytest.raises(LockHeld) as exc:
                async with b.hold(reset_lock_name("node3")):
                    pytest.fail("two holders")
            assert isinstance(exc.value, ResetRefused)  # a reset refused like any other
            msg = str(exc.value)
            assert msg.startswith("reset:node3 is busy: held by hostA:1 slack:U0BOB since 20")
            async with b.hold(reset_lock_name("node4")):  # another node is another lock
                pass
        async with b.hold(reset_lock_name("node3")):  # released: free for the next one
            pass
    finally:
        a.close()
        b.close()
        engine.dispose()


async def test_a_cancelled_holder_gives_the_lock_back(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    locks = DbLeases(engine)
    inside = asyncio.Event()

    async def holder() -> None:
        async with locks.hold(SWEEP_LOCK):
            inside.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(holder())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with locks.hold(SWEEP_LOCK):
        pass
    locks.close()
    engine.dispose()


async def test_postgresql_locks_are_per_schema(tmp_path: Path) -> None:
    with temp_database("postgresql", tmp_path) as one, temp_database("postgresql", tmp_path) as two:
        e1, e2 = sa.create_engine(one), sa.create_engine(two)
        l1, l2, l1b = DbLeases(e1), DbLeases(e2), DbLeases(e1)
        try:
            async with l1.hold(SWEEP_LOCK), l2.hold(SWEEP_LOCK):  # two deployments: no conflict
                with pytest.raises(LockHeld):
                    async with l1b.hold(SWEEP_LOCK):  # the same deployment: conflict
                        pass
        finally:
            for x in (l1, l2, l1b):
                x.close()
            e1.dispose()
            e2.dispose()


async def test_the_schedule_never_overlaps_and_stops_cleanly() -> None:
    spans: list[tuple[float, float]] = []

    async def slow_sweep() -> None:
        started = time.monotonic()
        await asyncio.sleep(0.35)
        spans.append((started, time.monotonic()))

    sched = IntervalScheduler(slow_sweep, 0.1, first_after_s=0)
    sched.start()
    await until(lambda: len(spans) >= 2, 30, "two sweeps")
    await sched.stop()  # lets the sweep under way finish
    assert len(spans) >= 2 and sched.runs == len(spans)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # one at a time
    n = len(spans)
    await asyncio.sleep(0.3)
    assert len(spans) == n  # stopped means stopped


async def test_a_failing_sweep_does_not_stop_the_schedule() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    sched = IntervalScheduler(broken, 0.1, first_after_s=0)
    sched.start()
    await until(lambda: calls >= 3, 30, "three failed sweeps")
    await sched.stop()
    assert calls >= 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("locks"), nodes=2, gpus=1) as f:
        yield f


async def test_one_scheduled_sweep_an_interval(fleet: SimFleet, db_url: str) -> None:
    s = load(fleet.config_path)
    s = with_sweep(dataclasses.replace(s, database_url=db_url), interval_s=30)
    app_a, app_b = build(s, {}, need_store=True), build(s, {}, need_store=True)
    assert app_a.store is not None and app_b.store is not None
    locks_a, locks_b = (
        DbLeases(app_a.store.engine, replica="A"),
        DbLeases(app_b.store.engine, replica="B"),
    )
    ports_a = sweep_ports(s, app_a.store, locks=locks_a)
    ports_b = sweep_ports(s, app_b.store, locks=locks_b)
    a = SweepService(s, app_a.status, app_a.transport, ports_a, replica="A")
    b = SweepService(s, app_b.status, app_b.transport, ports_b, replica="B")
    try:
        async with locks_a.hold(SWEEP_LOCK, holder="sweep"):  # A is sweeping right now
            busy = await b.scheduled()
        assert busy.skipped is not None and busy.skipped.startswith("sweep is busy: held by A")
        done = await a.scheduled()
        assert done.skipped is None and len(done.snapshots) == 2
        again = await b.scheduled()  # B's turn comes, but A swept moments ago
        assert again.skipped is not None and "another replica swept at" in again.skipped
        # A's own sweep never stands in for A's next turn: A's scheduler spaces its runs, and
        # a run that began late must not cost the next one its turn (the clock-step test under
        # load). Only another replica's sweep does.
        mine = await a.scheduled()
        assert mine.skipped is None and len(mine.snapshots) == 2
        assert (await b.scheduled()).skipped is not None
        sweeps = [r for r in await app_a.store.queries() if r.data["query"] == "sweep"]
        assert [(r.actor, r.source) for r in sweeps] == [("gpubot:A", "schedule")] * 2
    finally:
        for x in (locks_a, locks_b):
            x.close()
        await app_a.close()
        await app_b.close()
