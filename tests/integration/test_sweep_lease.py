"""The sweep lease with two replicas on a PostgreSQL server of the test's own, restarted while one
replica sweeps: the other still stands aside until the first is done (and its lease is free).
The control is the old session-level advisory lock: across the restart the second replica
sweeps at the same time as the first.

Two replicas are two stores (their own connections), two lease holders and two sweep services
in this process, as ``test_sweep_locks.py`` builds them; the fleet is the simulated one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gpubot.config import Settings, load
from gpubot.services.status import StatusService
from gpubot.services.sweep import SWEEP_LOCK, SweepService
from gpubot.store import open_store
from gpubot.store.leases import DbLeases
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet
from tests.fixtures.own_pg import OwnPostgres, own_postgres
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.integration.lease_control import AdvisoryLocks

SLOW_S = 4.0  # every sweep lasts this long (the node's nvidia-smi is slow)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("sweep-lease"), nodes=1, gpus=1) as f:
        yield f


@pytest.fixture(scope="module")
def pg() -> Iterator[OwnPostgres]:
    with own_postgres() as server:
        yield server


@pytest.fixture
def settings(fleet: SimFleet, pg: OwnPostgres) -> Settings:
    s = load(fleet.config_path)
    s = dataclasses.replace(s, database_url=pg.database())
    return with_sweep(s, interval_s=60, budget_s=30)


@asynccontextmanager
async def sweeper(settings: Settings, name: str, *, advisory: bool) -> AsyncIterator[SweepService]:
    store = open_store(settings.database_url)
    locks: Any = (
        AdvisoryLocks(store.engine, name)
        if advisory
        else DbLeases(store.engine, replica=name, ttl_s=15, renew_s=0.3)
    )
    transport = make_transport(settings.ssh)
    status = StatusService(settings, transport, store)
    ports = sweep_ports(settings, store, locks=locks)
    svc = SweepService(settings, status, transport, ports, replica=name)
    try:
        yield svc
    finally:
        await transport.close()
        if advisory:
            locks.close()
        store.close()


async def _second_during_first(
    settings: Settings, pg: OwnPostgres, fleet: SimFleet, *, advisory: bool
) -> tuple[Any, Any]:
    """A sweeps (slowly); PostgreSQL restarts; B's turn comes while A still sweeps."""
    fleet.node("node1").set_fault("slow", delay_s=SLOW_S)
    try:
        async with (
            sweeper(settings, "A", advisory=advisory) as a,
            sweeper(settings, "B", advisory=advisory) as b,
        ):
            first = asyncio.create_task(a.scheduled())
            await asyncio.sleep(1.0)  # A holds the sweep and waits on the node
            await asyncio.to_thread(pg.restart)
            assert not first.done()
            second = await b.scheduled()
            return await first, second
    finally:
        fleet.node("node1").set_fault(None)


async def test_the_sweep_lease_survives_a_restart_with_two_replicas(
    settings: Settings, pg: OwnPostgres, fleet: SimFleet
) -> None:
    first, second = await _second_during_first(settings, pg, fleet, advisory=False)
    assert first.skipped is None and len(first.snapshots) == 1  # A swept, across the restart
    assert second.skipped is not None
    assert second.skipped.startswith(f"{SWEEP_LOCK} is busy: held by A sweep since ")
    async with sweeper(settings, "B", advisory=False) as b:  # A released it: B may, next time
        assert b.locks is not None
        async with b.locks.hold(SWEEP_LOCK) as lease:
            assert lease.took_over is None


async def test_control_the_advisory_sweep_lock_lets_two_replicas_sweep_at_once(
    settings: Settings, pg: OwnPostgres, fleet: SimFleet
) -> None:
    first, second = await _second_during_first(settings, pg, fleet, advisory=True)
    assert first.skipped is None
    assert second.skipped is None and len(second.snapshots) == 1  # B swept during A's sweep
