"""A node's reset lease under real faults: a PostgreSQL server of the test's own restarted during
a reset's grace wait, and the lease taken away (expired, then taken over) on PostgreSQL and
SQLite. Two "replicas" are two stores, two lease holders and two reset engines in this process,
each with its own connections; the node is the simulated fleet (real processes, real SSH).

Controls: the old session-level advisory lock loses the node across a restart (the second reset
runs), and a fence that never refuses lets the first holder SIGKILL after it lost the lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.config import Settings, load
from gpubot.core.lease import Lease
from gpubot.core.ports import Locks
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import LockHeld, ResetInterrupted
from gpubot.services.reset import Ask, ResetEvent, ResetResult, ResetService, reset_lock
from gpubot.services.status import StatusService
from gpubot.store import Store, open_store
from gpubot.store import leases as leases_mod
from gpubot.store.leases import DbLeases
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import leave_clean
from tests.fixtures.own_pg import OwnPostgres, own_postgres
from tests.integration.lease_control import AdvisoryLocks
from tests.procs import alive, wait_dead

GRACE_S = 6.0
TTL_S, RENEW_S = 15.0, 0.3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("lease-faults"), nodes=1, gpus=2, release_delay_s=0.2
    ) as f:
        yield f


@pytest.fixture(scope="module")
def pg() -> Iterator[OwnPostgres]:
    with own_postgres() as server:
        yield server


@pytest.fixture
def pg_url(pg: OwnPostgres) -> str:
    return pg.database()  # a fresh database of the test's own on the shared server


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    leave_clean(n)


@pytest.fixture
def settings(fleet: SimFleet) -> Settings:
    s = load(fleet.config_path)
    reset = dataclasses.replace(s.reset, grace_s=GRACE_S, verify_timeout_s=8.0, poll_interval_s=0.2)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=15.0)
    return dataclasses.replace(s, reset=reset, ssh=ssh)


@dataclass
class Replica:
    """One gpubot: its store, its leases (or locks) and its reset engine."""

    store: Store
    locks: Locks
    reset: ResetService


@asynccontextmanager
async def replica(
    settings: Settings, url: str, name: str, *, advisory: bool = False
) -> AsyncIterator[Replica]:
    store = open_store(url)
    locks: Any = (
        AdvisoryLocks(store.engine, name)
        if advisory
        else DbLeases(store.engine, replica=name, ttl_s=TTL_S, renew_s=RENEW_S)
    )
    transport = make_transport(settings.ssh)
    engine = ResetService(
        settings, transport, store, StatusService(settings, transport, store), locks
    )
    try:
        yield Replica(store, locks, engine)
    finally:
        await transport.close()
        if advisory:
            locks.close()
        store.close()


class FirstReset:
    """A reset of GPU 0 of node1 running as a task; ``in_grace`` is set once SIGTERM is out."""

    def __init__(self, r: Replica, grace_s: float = GRACE_S) -> None:
        self.in_grace = asyncio.Event()
        self.events: list[ResetEvent] = []
        self.task = asyncio.create_task(self._run(r, grace_s))

    async def _sink(self, event: ResetEvent) -> None:
        self.events.append(event)
        if event.kind == "signal" and event.data.get("signal") == "SIGTERM":
            self.in_grace.set()

    async def _run(self, r: Replica, grace_s: float) -> ResetResult:
        plan, before = await r.reset.plan(ResetRequest("node1", None, gpus=(0,)))
        return await r.reset.execute(
            plan,
            Ask.by("test:A", "test", "reset A", grace_s=grace_s, on_event=self._sink),
            before=before,
        )

    async def started(self) -> None:
        done, _ = await asyncio.wait(
            [self.task, asyncio.ensure_future(self.in_grace.wait())],
            timeout=60,
            return_when=asyncio.FIRST_COMPLETED,
        )
        assert self.in_grace.is_set(), f"no SIGTERM: {self.task.result() if done else 'timeout'}"


async def second_reset(r: Replica) -> ResetResult:
    plan, before = await r.reset.plan(ResetRequest("node1", None, gpus=(0,)))
    return await r.reset.execute(
        plan, Ask.by("test:B", "test", "reset B", grace_s=0.0), before=before
    )


async def test_a_restarted_postgresql_keeps_the_node_lease(
    settings: Settings, pg: OwnPostgres, pg_url: str, node: SimNode
) -> None:
    w = node.spawn(gpu=0, mib=2048, behaviour="stubborn")  # SIGTERM is not enough: SIGKILL
    async with replica(settings, pg_url, "A") as a, replica(settings, pg_url, "B") as b:
        first = FirstReset(a)
        await first.started()
        await asyncio.to_thread(pg.restart)  # every connection of both replicas is cut
        assert not first.task.done()  # still in its grace wait
        with pytest.raises(LockHeld) as refused:  # the row survived the restart
            await second_reset(b)
        assert "reset:node1 is busy: held by A test:A since " in str(refused.value)
        assert alive(w.pid)  # B signalled nothing
        result = await first.task  # A renews after the restart and finishes: SIGKILL
        assert result.ok, [g.detail for g in result.gpus]
        sent = [(s.data["signal"], s.data["result"]) for s in result.steps if s.kind == "signal"]
        assert sent == [("SIGTERM", "sent"), ("SIGKILL", "sent")]
        wait_dead(w.pid)
        async with b.locks.hold(reset_lock("node1")) as lease:  # free once A is done
            assert lease.token >= 2 and lease.took_over is None  # released, not taken over
        actions = await b.store.actions(node="node1")
        assert [(x.actor, x.status) for x in actions][:1] == [("test:A", "freed")]
        assert all(x.actor != "test:B" for x in actions)  # B's reset never began
        assert (await b.store.verify()).ok


async def test_control_the_advisory_lock_is_lost_across_a_restart(
    settings: Settings, pg: OwnPostgres, pg_url: str, node: SimNode
) -> None:
    """The old mechanism, the same sequence: the second reset runs during the first's wait."""
    w = node.spawn(gpu=0, mib=2048, behaviour="stubborn")
    async with (
        replica(settings, pg_url, "A", advisory=True) as a,
        replica(settings, pg_url, "B", advisory=True) as b,
    ):
        first = FirstReset(a)
        await first.started()
        await asyncio.to_thread(pg.restart)
        assert not first.task.done()
        second = await second_reset(b)  # not refused: the server freed A's lock
        assert second.ok and not alive(w.pid)  # B killed it while A was still at work
        done = await first.task
        assert done.action_id is not None and second.action_id is not None
        a_detail = await b.store.action(done.action_id)
        assert a_detail is not None
        (a_end,) = [r.seq for r in a_detail.records if r.kind == "outcome"]
        assert done.action_id < second.action_id < a_end  # B's reset ran inside A's


def _expire(store: Store, resource: str) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat(timespec="microseconds")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE leases SET expires_at = :t WHERE resource = :r"),
            {"t": past.replace("+00:00", "Z"), "r": resource},
        )


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, pg: OwnPostgres, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return pg.database()
    url = f"sqlite:///{tmp_path}/audit.db"
    open_store(url).close()  # a new SQLite file sets itself up
    return url


async def _taken_away(a: Replica, b: Replica, w_pid: int) -> tuple[FirstReset, Lease]:
    """Start A's reset; in its grace wait, let its lease run out and B take it over."""
    first = FirstReset(a, grace_s=3.0)
    await first.started()
    _expire(a.store, reset_lock("node1"))  # A stopped renewing (a long outage, a stall)
    async with b.locks.hold(reset_lock("node1"), holder="test:B") as lease:
        assert lease.took_over is not None and alive(w_pid)
        await asyncio.wait([first.task], timeout=60)  # B holds it until A has ended
    return first, lease


async def test_a_holder_that_lost_its_lease_stops_before_its_next_signal(
    settings: Settings, db_url: str, node: SimNode
) -> None:
    w = node.spawn(gpu=0, mib=2048, behaviour="stubborn")
    async with replica(settings, db_url, "A") as a, replica(settings, db_url, "B") as b:
        first, _ = await _taken_away(a, b, w.pid)
        with pytest.raises(ResetInterrupted) as cut:
            first.task.result()
        msg = str(cut.value)
        assert msg.startswith("lost the node lease: another gpubot may be acting on node1")
        assert f"already sent on node1: SIGTERM to pid {w.pid} at " in msg
        assert "still alive at " in msg and "GPU 0: unknown" in msg
        await asyncio.sleep(1.0)
        assert alive(w.pid)  # no SIGKILL went out after the lease was gone
        action = (await a.store.actions(node="node1"))[0]  # the newest: A's
        assert action.actor == "test:A"
        detail = await a.store.action(action.id)
        assert detail is not None and action.status == "error"
        assert detail.result is not None
        assert [g["outcome"] for g in detail.result["gpus"]] == ["unknown"]
        assert [(s["pid"], s["signal"]) for s in detail.result["sent"]] == [(w.pid, "SIGTERM")]
        kinds = [e.data["kind"] for e in detail.events]
        assert "SIGKILL" not in str([e.data for e in detail.events if e.data["kind"] == "signal"])
        assert kinds.count("sending") == 1  # SIGTERM's intent; SIGKILL's was refused
        notes = [r for r in await a.store.records() if r.kind == "lease"]
        assert notes and notes[-1].data["took_over"]["holder"] == "A test:A"
        assert notes[-1].actor == "B test:B"
        (term,) = [r.seq for r in detail.records if r.data.get("kind") == "signal"]
        (end,) = [r.seq for r in detail.records if r.kind == "outcome"]
        assert term < notes[-1].seq < end  # taken over after SIGTERM, before A's end
        assert (await a.store.verify()).ok


async def test_control_without_the_fence_the_old_holder_kills_after_losing_it(
    settings: Settings, db_url: str, node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defence removed (the fence never refuses): A SIGKILLs while B holds the node."""
    monkeypatch.setattr(leases_mod, "renew", lambda *_: True)
    w = node.spawn(gpu=0, mib=2048, behaviour="stubborn")
    async with replica(settings, db_url, "A") as a, replica(settings, db_url, "B") as b:
        first, _ = await _taken_away(a, b, w.pid)
        result = first.task.result()
        sent = [s.data["signal"] for s in result.steps if s.kind == "signal"]
        assert sent == ["SIGTERM", "SIGKILL"] and not alive(w.pid)
