"""GPU health found by sweeps of the simulated fleet over real SSH and alerted once (issue 27).

Each state is a fault of the simulated nvidia-smi (``gpusim.health_faults``): its answers have
the real program's formats. The sweep is the real composition's, with the health checks as
``gpubot.app`` wires them; Slack is the loopback fake of the Web API, the store a real SQLite
database; time moves by a clock the test holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.core.alerting import SweepResult
from gpubot.core.health.findings import ECC_HOLD
from gpubot.services.health_checks import HealthChecks
from gpubot.services.sweep import SweepService
from gpubot.store import Store
from gpusim import health_faults as hf
from gpusim.fleet import SimFleet
from gpusim.node_layout import bus_id, pci_name
from tests.fixtures.db import temp_database
from tests.fixtures.health_sweep import (
    buttons,
    posts,
    settings_for,
    sweep,
    sweeper,
    text_of,
)
from tests.fixtures.settings import ManualClock
from tests.fixtures.slack import FakeSlack, assert_within_limits


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


async def test_a_maintenance_window_keeps_the_sweep_from_paging(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    """During node1's window its finding is recorded, sweep after sweep, and nothing is posted;
    once on-call ends the window, the next sweep posts it (the control: the same keeper pages)."""
    hf.set_gpu(fleet.node("node1"), 0, remap_pending=True)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        store = svc.audit
        assert isinstance(store, Store)
        now = clock.now()
        await store.maint.open(
            "node1", now - 60, 4 * 3600, "firmware", by="U0CAROL", source="test", now=now
        )
        for _ in range(3):
            found = await sweep(svc, clock)
            assert ("node1", 0, "memory-repair-pending") in kinds(found) and not found.alerted
        assert posts(fake_slack) == []  # recorded, not paged
        await store.maint.end("node1", by="U0CAROL", source="test", now=clock.now())
        after = await sweep(svc, clock)
        assert [(k.node, k.gpu, k.kind) for k in after.alerted] == [
            ("node1", 0, "memory-repair-pending")
        ]
    assert len(posts(fake_slack)) == 1


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
        await sweep(svc, clock)
        second = await sweep(svc, clock)  # two findings: errors since the load, and growth
        alerted = {(k.node, k.gpu, k.kind) for k in second.alerted}
        load, grew = ("node1", 2, "ecc-since-load"), ("node1", 2, "ecc-uncorrected")
        assert alerted == {load, grew}
        texts = [text_of(a) for a in posts(fake_slack)]
        assert any("volatile 0 → 2, aggregate 5 → 7" in t for t in texts)
        assert any("2 uncorrectable ECC errors since the driver loaded" in t for t in texts)
        for _ in range(ECC_HOLD + 2):  # no further growth: growth clears after its hold
            last = await sweep(svc, clock)
        # the volatile count stays above 0: that finding stands; both were alerted in one post
        assert kinds(last) == {load} and len(posts(fake_slack)) == 1


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


async def test_unwired_links_are_no_fault_and_a_gpu_that_loses_them_all_is(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    """Bridged PCIe cards outside a fabric: 6 of 18 links inactive on every GPU by design raise
    nothing, sweep after sweep; then GPU 1's links all go down (nvidia-smi says NVML's one line):
    the 12 it was seen with up are down. Control: the first sweeps found nothing."""
    n2 = fleet.node("node2")
    unwired = [4, 5, 10, 11, 16, 17]
    hf.set_node(n2, links=18)
    for g in range(4):
        hf.set_gpu(n2, g, links_down=unwired)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        for _ in range(3):
            result = await sweep(svc, clock)
            assert kinds(result) == set()
        snap = next(s for s in result.snapshots if s.node == "node2")
        assert all(g.health is not None and g.health.flags() == () for g in snap.gpus)
        hf.set_gpu(n2, 1, links_down=list(range(18)))
        alert = await alerted_once(svc, clock, fake_slack, ("node2", 1, "nvlink-down"))
    text = text_of(alert)
    assert "all 12 NVLink links inactive (NVML: all links are inactive)" in text
    assert "health: NVLink links down: 0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15" in text


async def test_a_gpu_vanishes_from_nvidia_smi_and_one_from_pci_too(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    """node2 shows its 4 GPUs, then GPU 1 leaves nvidia-smi's list (the kernel still sees it on
    PCI) and GPU 3 leaves both, with no error line: one finding names each bus id and where it is
    missing from. Control: the sweeps before found nothing, and node1 nothing throughout."""
    n2 = fleet.node("node2")
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        for _ in range(2):
            assert kinds(await sweep(svc, clock)) == set()
        assert isinstance(svc.health, HealthChecks)
        assert set(svc.health.last["node2"].pci or ()) == {pci_name(bus_id(g)) for g in range(4)}
        hf.vanish(n2, 1, from_pci=False)
        hf.vanish(n2, 3, from_pci=True)
        first = await sweep(svc, clock)
        assert kinds(first) == {("node2", None, "gpu-vanished")}
        snap = next(s for s in first.snapshots if s.node == "node2")
        assert sorted(g.index for g in snap.gpus) == [0, 2]
        alert = await alerted_once_node(svc, clock, fake_slack, ("node2", None, "gpu-vanished"))
    text = text_of(alert)
    b1, b3 = (pci_name(bus_id(g)) for g in (1, 3))
    assert "nvidia-smi shows 2 of the node's 4 GPUs" in text
    assert f"{b1} missing from nvidia-smi only (the kernel still sees it on PCI" in text
    assert f"{b3} missing from nvidia-smi and from the kernel's PCI devices" in text


async def alerted_once_node(
    svc: SweepService, clock: ManualClock, fake: FakeSlack, want: tuple[str, None, str]
) -> dict[str, Any]:
    """As ``alerted_once``, for a finding of the node (no GPU); the first sweep was run."""
    second = await sweep(svc, clock)
    assert [(k.node, k.gpu, k.kind) for k in second.alerted] == [want]
    for _ in range(2):
        assert (await sweep(svc, clock)).alerted == ()
    (alert,) = posts(fake)
    return alert


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
