"""What a real reset writes to the audit log, on SQLite and on PostgreSQL."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from gpubot.config import Settings, load
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import StoreError
from gpubot.services.reset import Ask, NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.store import open_store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("audit"), nodes=1, gpus=4, release_delay_s=0.3) as f:
        yield f


@pytest.fixture(scope="module")
def settings(fleet: SimFleet) -> Settings:
    s = load(fleet.config_path)
    reset = dataclasses.replace(s.reset, grace_s=0.5, verify_timeout_s=4.0, poll_interval_s=0.1)
    return dataclasses.replace(s, reset=reset)


async def test_a_reset_is_recorded_whole(
    fleet: SimFleet, settings: Settings, store_url: str
) -> None:
    store = open_store(store_url)
    transport = make_transport(settings.ssh)
    engine = ResetService(settings, transport, store, StatusService(settings, transport, store))
    polite = fleet.node("node1").spawn(gpu=1, mib=3000)
    stubborn = fleet.node("node1").spawn(gpu=1, mib=1000, behaviour="stubborn")
    try:
        plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(1,)))
        result = await engine.execute(
            plan, Ask.by("U0ALICE alice", "slack:C0OPS", "/gpu reset node1 gpu 1"), before=before
        )
    finally:
        await transport.close()
    assert result.ok and result.action_id is not None
    detail = await store.action(result.action_id)
    assert detail is not None
    s = detail.summary
    assert (s.kind, s.actor, s.source, s.command, s.node, s.gpus, s.status) == (
        "reset",
        "U0ALICE alice",
        "slack:C0OPS",
        "/gpu reset node1 gpu 1",
        "node1",
        (1,),
        "freed",
    )
    assert s.finished_at is not None and s.finished_at >= s.started_at
    assert {t["pid"] for t in detail.plan["targets"]} == {polite.pid, stubborn.pid}
    signals = [e.data for e in detail.events if e.data.get("kind") == "signal"]
    assert {(d["pid"], d["signal"], d["result"]) for d in signals} == {
        (polite.pid, "SIGTERM", "sent"),
        (stubborn.pid, "SIGTERM", "sent"),
        (stubborn.pid, "SIGKILL", "sent"),
    }
    assert all("at" in d for d in signals)
    (gpu,) = detail.result["gpus"]
    assert gpu["outcome"] == "freed" and gpu["memory_before_mib"] == 4000
    assert gpu["memory_after_mib"] <= 256 and gpu["seconds_to_free"] is not None
    assert (await store.verify()).ok
    assert result.action_id not in {a.id for a in await store.incomplete_actions()}
    store.close()


async def test_a_closed_database_signals_nothing(
    fleet: SimFleet, settings: Settings, closed_port_url: str
) -> None:
    store = open_store(closed_port_url, check_schema=False)
    transport = make_transport(settings.ssh)
    engine = ResetService(
        settings, transport, store, StatusService(settings, transport), NodeLocks()
    )
    w = fleet.node("node1").spawn(gpu=2, mib=1000)
    try:
        plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(2,)))
        with pytest.raises(StoreError, match="nothing was done"):
            await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
        assert os.path.exists(f"/proc/{w.pid}")
    finally:
        await transport.close()
        os.kill(w.pid, 9)
