"""GPU health found by sweeps of the simulated fleet over real SSH and alerted once (issue 27).

Each state is a fault of the simulated nvidia-smi (``gpusim.health_faults``): its answers have
the real program's formats. The sweep is the real composition's, with the health checks as
``gpubot.app`` wires them; Slack is the loopback fake of the Web API, the store a real SQLite
database; time moves by a clock the test holds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpubot.core.alerting import SweepResult
from gpubot.core.health.findings import ECC_HOLD
from gpubot.services.health_checks import HealthChecks, wire_health
from gpubot.services.sweep import SweepService
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpusim import health_faults as hf
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.settings import ManualClock, sweep_ports, with_tables
from tests.fixtures.slack import BOT_TOKEN, FakeSlack, assert_within_limits

CHANNEL = "C0HEALTH"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("health"), nodes=2, gpus=4) as f:
        yield f


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        n.clear()
        Path(n.fabricmanager_pid).unlink(missing_ok=True)


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("sqlite", tmp_path) as url:
        yield url


def settings_for(fleet: SimFleet, db_url: str) -> Settings:
    s = load(fleet.config_path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=10.0, connect_timeout_s=5.0)
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh)
    return with_tables(s, {"sweep": {"interval_s": 60}, "alerts": {"channel": CHANNEL}})


@asynccontextmanager
async def sweeper(
    settings: Settings, fake: FakeSlack, clock: ManualClock
) -> AsyncIterator[SweepService]:
    app = build(settings, {}, need_store=True)
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake.base_url)), CHANNEL)
    ports = sweep_ports(settings, app.store, notifier=notifier, clock=clock)
    assert app.store is not None
    health = wire_health(settings, app.transport, app.store.ecc)
    assert health is not None
    app.status.decorators.append(health.decorate)  # as the root wires it
    ports = dataclasses.replace(ports, health=health)
    svc = SweepService(settings, app.status, app.transport, ports, clock=clock, replica="t")
    try:
        yield svc
    finally:
        await app.close()


async def sweep(svc: SweepService, clock: ManualClock) -> SweepResult:
    clock.advance(60)
    return await svc.run()


def posts(fake: FakeSlack) -> list[dict[str, Any]]:
    return [c.body for c in fake.ok("chat.postMessage")]


def text_of(body: dict[str, Any]) -> str:
    b = body.get("blocks") or []
    return json.dumps(json.loads(b) if isinstance(b, str) else b, ensure_ascii=False)


def buttons(body: dict[str, Any]) -> list[tuple[str, str]]:
    b = body.get("blocks") or []
    blocks = json.loads(b) if isinstance(b, str) else b
    return [
        (e["action_id"], e["value"])
        for x in blocks
        if x["type"] == "actions"
        for e in x["elements"]
    ]


def kinds(result: SweepResult) -> set[tuple[str, int | None, str]]:
    return {(f.node, f.gpu, f.kind.value) for f in result.findings}


async def alerted_once(
    svc: SweepService, clock: ManualClock, fake: FakeSlack, want: tuple[str, int, str]
) -> dict[str, Any]:
    """Sweep until ``want`` is alerted (two sweeps in a row find it); then twice more: once."""
    first = await sweep(svc, clock)
    assert want in kinds(first) and posts(fake) == []
    second = await sweep(svc, clock)
    assert [(k.node, k.gpu, k.kind) for k in second.alerted] == [want]
    for _ in range(2):
        assert (await sweep(svc, clock)).alerted == ()
    (alert,) = posts(fake)
    return alert


async def test_pending_remap_offers_a_reset_of_the_idle_gpu(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    hf.set_gpu(n1, 0, remap_pending=True)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        alert = await alerted_once(svc, clock, fake_slack, ("node1", 0, "memory-repair-pending"))
    text = text_of(alert)
    assert "GPU memory repair pending" in text and "gpu-reset node1 gpu 0 now" in text
    assert "health: memory repair pending: a reset applies it" in text  # readiness
    assert "memory-repair-pending" in text  # the flag in the node's table
    assert ("gpubot_reset_gpu", "node1:0") in buttons(alert)
    assert_within_limits(fake_slack)


async def test_pending_remap_on_a_busy_gpu_goes_through_the_reset_first(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n2 = fleet.node("node2")
    n2.spawn(gpu=1, mib=2048)
    hf.set_gpu(n2, 1, remap_pending=True)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        alert = await alerted_once(svc, clock, fake_slack, ("node2", 1, "memory-repair-pending"))
    text = text_of(alert)
    assert "1 process(es) hold it: stop them first" in text and "through approval" in text
    assert "then gpu-reset node2 gpu 1" in text and "gpu-reset node2 gpu 1 now" not in text
    assert ("gpubot_reset_gpu", "node2:1") in buttons(alert)


async def test_a_failed_remap_is_hardware(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    hf.set_gpu(fleet.node("node1"), 3, remap_failure=True)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        alert = await alerted_once(svc, clock, fake_slack, ("node1", 3, "remap-failed"))
    text = text_of(alert)
    assert "Hardware: drain it and open a ticket" in text
    assert not [b for b in buttons(alert) if b[0] == "gpubot_reset_gpu"]  # a reset cannot help


async def test_a_growing_uncorrectable_ecc_count(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    hf.set_gpu(n1, 2, ecc_volatile=0, ecc_aggregate=5)  # a lifetime count: the baseline
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        assert kinds(await sweep(svc, clock)) == set()
        assert kinds(await sweep(svc, clock)) == set()  # it does not grow: nothing
        hf.set_gpu(n1, 2, ecc_volatile=2, ecc_aggregate=7)
        alert = await alerted_once(svc, clock, fake_slack, ("node1", 2, "ecc-uncorrected"))
        assert "volatile 0 → 2, aggregate 5 → 7" in text_of(alert)
        for _ in range(ECC_HOLD + 2):  # no further growth: it clears after its hold
            last = await sweep(svc, clock)
        assert kinds(last) == set() and len(posts(fake_slack)) == 1


async def test_fabric_not_ready_names_the_fabric_manager(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n2 = fleet.node("node2")
    hf.set_node(n2, fabric=True, links=4)
    hf.set_gpu(n2, 1, fabric_state="In Progress", fabric_status="[N/A]")
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        alert = await alerted_once(svc, clock, fake_slack, ("node2", 1, "fabric-not-ready"))
        text = text_of(alert)
        assert "NVSwitch fabric state In Progress" in text
        assert "fabric manager: not running" in text and "start nvidia-fabricmanager" in text
        assert "health: NVSwitch fabric not ready" in text  # gpu-reset readiness
        fm = hf.start_fabric_manager(n2)
        try:
            result = await sweep(svc, clock)
        finally:
            hf.stop_fabric_manager(n2, fm)
    (f,) = [f for f in result.findings if f.kind.value == "fabric-not-ready"]
    assert f"fabric manager: running (pid {fm.pid}" in f.summary
    assert "start nvidia-fabricmanager" not in f.summary


async def test_a_link_down(fleet: SimFleet, db_url: str, fake_slack: FakeSlack) -> None:
    n1 = fleet.node("node1")
    hf.set_node(n1, fabric=True, links=18)
    hf.set_gpu(n1, 2, links_down=[3, 5])
    fm = hf.start_fabric_manager(n1)
    clock = ManualClock()
    try:
        async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
            alert = await alerted_once(svc, clock, fake_slack, ("node1", 2, "nvlink-down"))
    finally:
        hf.stop_fabric_manager(n1, fm)
    text = text_of(alert)
    assert "2 of 18 NVLink links inactive (link 3, 5)" in text
    assert "gpu-reset node1 gpu 2 now" in text
    assert "health: NVLink links down: 3, 5" in text


async def test_sustained_thermal_slowdown_alerts_and_a_moment_does_not(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1, n2 = fleet.node("node1"), fleet.node("node2")
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        hf.set_gpu(n2, 0, slowdown=["hw_thermal_slowdown"], temperature=93)  # a moment
        assert kinds(await sweep(svc, clock)) == set()
        hf.set_gpu(n2, 0, slowdown=None, temperature=None)
        for _ in range(3):
            assert kinds(await sweep(svc, clock)) == set()
        assert posts(fake_slack) == []
        hf.set_gpu(n1, 1, slowdown=["hw_thermal_slowdown", "sw_thermal_slowdown"], temperature=92)
        assert kinds(await sweep(svc, clock)) == set()  # the first sweep: not yet
        alert = await alerted_once(svc, clock, fake_slack, ("node1", 1, "gpu-throttled"))
    text = text_of(alert)
    assert "HW thermal slowdown, SW thermal slowdown for two sweeps or more at 92 C" in text
    assert "check the box's cooling" in text


async def test_a_consumer_gpu_says_na_and_raises_nothing(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    hf.set_node(n1, consumer=True, links=4)  # no ECC, no remapper, no fabric; links all down
    hf.set_gpu(n1, 0, links_down=[0, 1, 2, 3])
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        for _ in range(3):
            result = await sweep(svc, clock)
            assert kinds(result) == set()
        assert isinstance(svc.health, HealthChecks)
        h = svc.health.last["node1"]
    assert posts(fake_slack) == []
    g0 = h.gpus[0]
    assert (g0.ecc_volatile, g0.remap_pending, g0.remap_failure, g0.fabric_state) == (
        None,
        None,
        None,
        None,
    )
    snap = next(s for s in result.snapshots if s.node == "node1")
    assert all(g.health is not None and g.health.flags() == () for g in snap.gpus)


async def test_an_older_driver_is_asked_its_own_fields(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n2 = fleet.node("node2")
    hf.set_node(n2, legacy=True)
    hf.set_gpu(n2, 3, remap_pending=True)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        result = await sweep(svc, clock)
        assert isinstance(svc.health, HealthChecks)
        assert svc.health.last["node2"].field_set == "r460"  # no clocks_event_reasons, fabric
    assert ("node2", 3, "memory-repair-pending") in kinds(result)
    assert result.failed == {}


async def test_a_process_named_like_the_fabric_manager_is_not_taken_for_it(
    fleet: SimFleet, db_url: str
) -> None:
    """Only the pid file (root's, in /run on a real box) says which process is the daemon: a
    process of any name without it is not; a pid file naming another process is stale. Control:
    the same process named by the pid file is the daemon."""
    n1 = fleet.node("node1")
    hf.set_node(n1, fabric=True, links=4)
    settings = settings_for(fleet, db_url)
    app = build(settings, {}, need_store=False)
    checks = HealthChecks(app.transport)
    node = settings.nodes[0]
    fm = hf.start_fabric_manager(n1)
    try:
        assert (await checks.read(node)).fabric_manager.startswith(f"running (pid {fm.pid}")
        Path(n1.fabricmanager_pid).unlink()  # the look-alike runs on, with no pid file
        assert (await checks.read(node)).fabric_manager == "not running"
        other = n1.spawn(None, behaviour="ctl-only")  # a pid file naming another process
        Path(n1.fabricmanager_pid).write_text(f"{other.pid}\n", encoding="utf-8")
        assert (await checks.read(node)).fabric_manager == "not running (stale pid file)"
    finally:
        hf.stop_fabric_manager(n1, fm)
        await app.close()
