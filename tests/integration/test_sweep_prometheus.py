"""Sweeps narrowed by a real Prometheus and confirmed over real SSH (issue 38).

The fleet is the simulated one at ``SimFleet``'s largest (64 nodes of 4 GPUs; 1,000 nodes are
``benchmarks/prom_sweep.py``'s). A real Prometheus scrapes one exporter text serving the corpus's
recorded dcgm-exporter sample as every GPU of the fleet (``fleet_text``), its values set by each
test: what the node holds, or a lie. SSH execs are counted by the nodes' own SSH servers
(``SimFleet.execs``), not by gpubot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpubot.core.alerting import SweepResult
from gpubot.core.telemetry import ECC_GREW, HELD_QUIET, IDLE_WINDOW, REMAP_PENDING, XID_CHANGED
from gpubot.services.sweep import SweepService
from gpusim.dcgm_text import GpuValues
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.fleet import leave_clean
from tests.fixtures.prometheus import Prometheus, fleet_text, serving
from tests.fixtures.settings import ManualClock, sweep_ports, with_sweep
from tests.procs import wait_dead

NODES, GPUS = 64, 4
USED, UTIL = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"
XID, REMAP, ECC = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
)
Values = dict[tuple[str, int], GpuValues]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    tmp = tmp_path_factory.mktemp("prom-sweep")
    with SimFleet(tmp / "fleet", nodes=NODES, gpus=GPUS, release_delay_s=0.3) as f:
        yield f


@pytest.fixture(scope="module")
def prom(fleet: SimFleet) -> Iterator[Prometheus]:
    with serving({"fleet": fleet_text(gpus_of(fleet))}) as p:
        yield p


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        leave_clean(n)


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (a workload this test started) and wait until it is dead."""
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)


def gpus_of(fleet: SimFleet) -> dict[str, int]:
    return {n.name: GPUS for n in fleet.nodes}


def serve(prom: Prometheus, fleet: SimFleet, values: Values, drop: tuple[str, ...] = ()) -> None:
    """Serve ``values`` (the rest: free GPUs, as recorded) and wait until Prometheus has them."""
    gpus = {n: c for n, c in gpus_of(fleet).items() if n not in drop}
    prom.exporter.serve("fleet", fleet_text(gpus, values))
    prom.wait_scraped()


def settings_for(
    fleet: SimFleet, tmp: Path, url: str | None, idle_hours: float = 1, **prom: Any
) -> Settings:
    text = fleet.config_path.read_text() + '\n[groups.sim]\ntelemetry = "prometheus"\n'
    if url is not None:
        text += f'\n[prometheus]\nurl = "{url}"\n' + "".join(
            f"{k} = {v}\n" for k, v in prom.items()
        )
    path = tmp / "gpubot.toml"
    path.write_text(text)
    s = load(path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=20.0, connect_timeout_s=10.0)
    s = dataclasses.replace(s, ssh=ssh)
    return with_sweep(s, interval_s=60, budget_s=50, idle_hours=idle_hours, idle_min_mib=4096)


def plain(settings: Settings) -> Settings:
    """The same fleet read over SSH alone (no node's telemetry is Prometheus)."""
    nodes = tuple(dataclasses.replace(n, telemetry="ssh") for n in settings.nodes)
    return dataclasses.replace(settings, nodes=nodes)


@asynccontextmanager
async def sweeper(
    settings: Settings, db: str, clock: ManualClock | None = None
) -> AsyncIterator[SweepService]:
    settings = dataclasses.replace(settings, database_url=db)
    app = build(settings, {}, need_store=True)
    kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    ports = sweep_ports(settings, app.store, **kw)
    svc = SweepService(settings, app.status, app.transport, ports, replica="test", **kw)
    try:
        yield svc
    finally:
        await app.close()


async def sweep(
    fleet: SimFleet, settings: Settings, db: str, *, alerting: bool = False
) -> tuple[SweepResult, dict[str, int]]:
    """One sweep by a fresh service, and the execs each node's SSH server ran for it."""
    before = fleet.execs()
    async with sweeper(settings, db) as svc:
        result = await svc.run(alerting=alerting, source="test")
    after = fleet.execs()
    return result, {n: c - before.get(n, 0) for n, c in after.items() if c > before.get(n, 0)}


def keys(result: SweepResult) -> set[tuple[str, int | None, str, str]]:
    return {(f.node, f.gpu, f.kind.value, f.holder) for f in result.findings}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    with temp_database("sqlite", tmp_path) as url:
        yield url


def busy_fleet(fleet: SimFleet) -> Values:
    """Busy jobs on every 8th node, as their exporters say them (not candidates)."""
    values: Values = {}
    for node in fleet.nodes[::8]:
        node.spawn(gpu=0, mib=4096, util_pct=50)
        values[(node.name, 0)] = {USED: 4096, UTIL: 50}
    return values


async def test_only_the_named_nodes_are_probed_and_the_findings_are_the_full_sweeps(
    fleet: SimFleet, prom: Prometheus, tmp_path: Path, db: str
) -> None:
    n = fleet.nodes
    values = busy_fleet(fleet)
    orphan = n[3].spawn(gpu=0, mib=6144, behaviour="orphan")
    kill(orphan.pid)
    values[(n[3].name, 0)] = {USED: 6144, UTIL: 0}  # held, no activity: as the node says
    hidden = n[10].spawn(gpu=1, mib=2048, behaviour="hidden")
    values[(n[10].name, 1)] = {USED: 2048, UTIL: 50, REMAP: 1}
    values[(n[17].name, 2)] = {XID: 0}
    values[(n[24].name, 3)] = {ECC: 0}
    serve(prom, fleet, values)
    values[(n[17].name, 2)] = {XID: 43}  # a new Xid, and ECC errors grown, since the last look
    values[(n[24].name, 3)] = {ECC: 2}
    serve(prom, fleet, values)
    settings = settings_for(fleet, tmp_path, prom.url)

    full, full_execs = await sweep(fleet, plain(settings), db)
    narrowed, execs = await sweep(fleet, settings, db)

    assert set(full_execs) == {x.name for x in n}  # the full sweep probed every node
    named = {n[3].name, n[10].name, n[17].name, n[24].name}
    assert set(execs) == named  # the nodes' own SSH servers ran nothing anywhere else
    assert execs[n[10].name] == execs[n[17].name] == execs[n[24].name] == 1  # the probe
    assert execs[n[3].name] == 2  # the probe, and the reset readiness of its orphaned GPU
    assert (
        keys(narrowed)
        == keys(full)
        == {
            (n[3].name, 0, "orphaned-vram", ""),
            (n[10].name, 1, "hidden-holder", f"{hidden.pid}:{hidden.start_ticks}"),
        }
    )
    by_node = {f.node: f for f in narrowed.findings}
    assert (
        by_node[n[3].name].source
        == f"named by prometheus (GPU 0: {HELD_QUIET}), confirmed over ssh"
    )
    assert REMAP_PENDING in (by_node[n[10].name].source or "")
    assert all(f.source is None for f in full.findings)
    assert len(narrowed.vouched) == NODES - 4 and narrowed.notes == ()
    assert {s.node for s in narrowed.snapshots} == named
    assert narrowed.to_dict()["findings"][0]["source"].startswith("named by prometheus")
    # named for what the node did not confirm: a look, and no finding
    assert (
        narrowed.named[n[17].name]
        == f"named by prometheus (GPU 2: {XID_CHANGED}), confirmed over ssh"
    )
    assert (
        narrowed.named[n[24].name] == f"named by prometheus (GPU 3: {ECC_GREW}), confirmed over ssh"
    )


async def test_prometheus_down_sweeps_every_node_over_ssh_with_one_line(
    fleet: SimFleet, tmp_path: Path, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    orphan = fleet.nodes[5].spawn(gpu=2, mib=3072, behaviour="orphan")
    kill(orphan.pid)
    with caplog.at_level(logging.WARNING, logger="gpubot.services.sweep_scope"):
        result, execs = await sweep(
            fleet, settings_for(fleet, tmp_path, f"http://127.0.0.1:{port}"), db
        )
    assert set(execs) == {x.name for x in fleet.nodes} and result.vouched == ()
    (note,) = result.notes
    assert note.startswith(f"prometheus http://127.0.0.1:{port}: no connection")
    assert note.endswith(f"{NODES} node(s) swept over SSH")
    assert [r.getMessage() for r in caplog.records] == [note]
    assert keys(result) == {(fleet.nodes[5].name, 2, "orphaned-vram", "")}
    assert all(f.source is None for f in result.findings)


async def test_stale_answers_are_swept_over_ssh_with_one_line(
    fleet: SimFleet, prom: Prometheus, tmp_path: Path, db: str
) -> None:
    serve(prom, fleet, {})
    stale = settings_for(fleet, tmp_path, prom.url, max_age_s=0.001)
    result, execs = await sweep(fleet, stale, db)
    assert set(execs) == {x.name for x in fleet.nodes} and result.vouched == ()
    (note,) = result.notes
    assert f"older than 0.001 s, for {NODES} node(s)" in note and note.endswith("swept over SSH")
    # one node's exporter no longer says it: that node alone is swept over SSH, with one line
    gone = fleet.nodes[7].name
    serve(prom, fleet, {}, drop=(gone,))
    result, execs = await sweep(fleet, settings_for(fleet, tmp_path, prom.url), db)
    (note,) = result.notes
    assert f"for 1 node(s): {gone}: swept over SSH" in note
    assert gone in execs and gone not in result.named and gone not in result.vouched
    # the others: only those Prometheus named (an earlier test's Xid may still be in its window)
    assert set(execs) == {gone, *result.named}
    assert len(result.vouched) == NODES - len(execs)


async def test_a_scrape_saying_free_never_clears_what_the_node_still_holds(
    fleet: SimFleet, prom: Prometheus, tmp_path: Path, db: str
) -> None:
    node = fleet.nodes[40]
    orphan = node.spawn(gpu=1, mib=5120, behaviour="orphan")
    kill(orphan.pid)
    found = (node.name, 1, "orphaned-vram", "")
    serve(prom, fleet, {(node.name, 1): {USED: 5120, UTIL: 0}})  # the truth, at first
    settings = settings_for(fleet, tmp_path, prom.url)
    first, _ = await sweep(fleet, settings, db, alerting=True)
    assert found in keys(first)
    serve(prom, fleet, {})  # then the exporter says the GPU is free (stale, or wrong)
    # a fresh service over the same database (a restart): the open alert has the node probed
    again, execs = await sweep(fleet, settings, db, alerting=True)
    assert node.name in execs and found in keys(again) and again.resolved == ()
    (f,) = [f for f in again.findings if f.node == node.name]
    assert f.source == "named by a finding or failure of an earlier sweep, confirmed over ssh"
    # control: with no finding open (a fresh database), the scrape alone hides the node
    (tmp_path / "fresh").mkdir()
    with temp_database("sqlite", tmp_path / "fresh") as other:
        blind, execs = await sweep(fleet, settings, other)
    assert node.name not in execs and found not in keys(blind)


async def test_a_scrape_saying_held_or_idle_decides_nothing_the_node_does_not_say(
    fleet: SimFleet, prom: Prometheus, tmp_path: Path, db: str
) -> None:
    free, busy, idle = fleet.nodes[48], fleet.nodes[52], fleet.nodes[56]
    busy.spawn(gpu=2, mib=8192, util_pct=80)
    hoarder = idle.spawn(gpu=3, mib=8192, util_pct=0)  # the control: idle on the node too
    lie = {USED: 8192, UTIL: 0}  # held, with no activity: all three, says the scrape
    window_s = 18.0
    serve(prom, fleet, {(free.name, 1): lie, (busy.name, 2): lie, (idle.name, 3): lie})
    time.sleep(window_s + 2)  # for the whole idle window, in Prometheus's own history
    settings = settings_for(fleet, tmp_path, prom.url, idle_hours=window_s / 3600)
    clock = ManualClock()
    async with sweeper(settings, db, clock) as svc:
        results = []
        for _ in range(3):
            results.append(await svc.run(alerting=False, source="test"))
            clock.advance(window_s)
    for r in results:
        for node, gpu in ((free, 1), (busy, 2), (idle, 3)):
            assert f"GPU {gpu}: {HELD_QUIET}" in r.named[node.name]
            assert f"GPU {gpu}: {IDLE_WINDOW}" in r.named[node.name]
    last = results[-1]
    # the node's own samples decide: only the hoarder idle on its node is an idle holder
    idle_found = {(f.node, f.gpu, f.holder) for f in last.findings if f.kind.value == "idle-holder"}
    assert idle_found == {(idle.name, 3, f"{hoarder.pid}:{hoarder.start_ticks}")}
    assert not [f for f in last.findings if f.node in (free.name, busy.name)]
