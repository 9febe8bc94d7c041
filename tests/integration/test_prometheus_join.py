"""The dashboard's holders-and-power table, its queries run against a real Prometheus.

A simulated fleet whose GPUs carry the UUIDs of the corpus's recorded dcgm-exporter samples
(tests/corpus/dcgm/) runs real workloads; a real sweep (SSH, the probe) feeds gpubot's metrics,
served on 127.0.0.1 as ``gpubot serve`` serves them; one real Prometheus scrapes both them and
the recorded samples. The queries are read from deploy/grafana-dashboard.json, never copied
here; the power each row must show is read from the samples' text line by line.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpubot.config import load
from gpubot.metrics import MIB, Metrics
from gpubot.services.status import StatusService
from gpubot.services.sweep import SweepPorts, SweepService
from gpubot.transport import make_transport
from gpusim import simstate
from gpusim.fleet import SimFleet
from tests.fixtures.daemons import need
from tests.fixtures.prometheus import dcgm_samples, dcgm_truth, running

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PANEL = "Holders and power"
LABELS = ("node", "gpu", "uuid", "user", "workload")
# What Grafana puts for the node variable set to All (every node, as a regex).
VARIABLES = {"$node": ".*"}
# The rename the panel makes in PromQL: without it, ``on (uuid)`` meets no dcgm-exporter series.
RELABEL = re.compile(r'label_replace\((\w+), "uuid", "\$1", "UUID", "\(\.\+\)"\)')
POWER = re.compile(r'^DCGM_FI_DEV_POWER_USAGE\{[^}]*\bUUID="([^"]+)"[^}]*\}\s+(\S+)', re.M)

Row = tuple[str, ...]


def panel_queries() -> dict[str, str]:
    """The holders-and-power table's queries by refId, from the checked-in dashboard."""
    doc = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    (panel,) = [p for p in doc["panels"] if p["title"].startswith(PANEL)]
    out = {}
    for t in panel["targets"]:
        expr = t["expr"]
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        out[t["refId"]] = expr
    return out


def without_relabel(expr: str) -> str:
    """The same join with dcgm-exporter's series as scraped (``UUID``, no ``uuid``)."""
    bare, n = RELABEL.subn(r"\1", expr)
    assert n == 1, expr  # the control must change the query, or it proves nothing
    return bare


def rows(result: list[dict[str, Any]]) -> dict[Row, float]:
    """A query's rows as the table shows them: the holder's labels, and the value."""
    return {tuple(r["metric"][k] for k in LABELS): float(r["value"][1]) for r in result}


def recorded_power() -> dict[str, float]:
    """Each recorded GPU's power (W), by UUID: the samples' lines, read without PromQL."""
    return {u: float(v) for text in dcgm_samples().values() for u, v in POWER.findall(text)}


def recorded_uuids() -> dict[str, str]:
    """The UUID of each sample's one GPU, by the sample's name."""
    out = {}
    for name, text in dcgm_samples().items():
        ((gpus,),) = [list(dcgm_truth(text).values())]
        (uuid,) = gpus
        out[name] = uuid
    return out


@dataclass(frozen=True)
class Served:
    """gpubot's metrics after a sweep, served on ``port``; the holders it must show."""

    port: int
    memory: dict[Row, float]  # every holder: its memory (bytes)
    uuids: dict[tuple[str, int], str]  # (node, GPU) -> its UUID


def adopt_uuids(fleet: SimFleet, uuids: dict[tuple[str, int], str]) -> None:
    """Give simulated GPUs the recorded GPUs' UUIDs (what their nvidia-smi then prints)."""
    for (node, gpu), uuid in uuids.items():
        with simstate.transaction(str(fleet.node(node).state_dir)) as state:
            state["gpus"][gpu]["uuid"] = uuid


async def sweep_into(metrics: Metrics, config: Path) -> None:
    settings = load(config)
    transport = make_transport(settings.ssh)
    try:
        status = StatusService(settings, transport, None)
        sweep = SweepService(settings, status, transport, SweepPorts(observer=metrics))
        result = await sweep.run(alerting=False)
        assert not result.failed, result.failed
    finally:
        await transport.close()


@pytest.fixture(scope="module")
def served(cgroups_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Two nodes of two GPUs: three carry recorded UUIDs (two of them with power, the A100's
    sample has none), one keeps its own; five holders, swept once, the metrics served."""
    rec = recorded_uuids()
    uuids = {
        ("node1", 0): rec["cncf-ericsson-ccd-t4"],
        ("node2", 0): rec["cncf-upcloud-l40s"],
        ("node2", 1): rec["cncf-vks-grid-a100"],
    }
    with SimFleet(
        tmp_path_factory.mktemp("join"),
        nodes=2,
        gpus=2,
        people=("alice", "bob"),
        runtimes=True,
        release_delay_s=0.3,
    ) as fleet:
        adopt_uuids(fleet, uuids)
        n1, n2 = fleet.node("node1"), fleet.node("node2")
        n1.spawn(gpu=0, mib=3000, user="alice", cgroup="docker", container_name="train-llama")
        n1.spawn(gpu=0, mib=1000, user="bob", name="torchrun")
        job = n1.spawn(gpu=1, mib=1500, cgroup="slurm", job_user="alice", job_name="sweep-lr")
        n2.spawn(gpu=0, mib=2048, user="alice", name="trainer")
        n2.spawn(gpu=1, mib=512, user="bob")
        own = n1.state()["gpus"][1]["uuid"]
        metrics = Metrics()
        asyncio.run(sweep_into(metrics, fleet.config_path))
        port = metrics.serve(0)
        t4, l40s, a100 = (uuids[k] for k in [("node1", 0), ("node2", 0), ("node2", 1)])
        memory = {
            ("node1", "0", t4, "root", "docker:train-llama"): 3000,  # a root container's owner
            ("node1", "0", t4, "bob", "torchrun"): 1000,
            ("node1", "1", own, "alice", f"slurm:{job.job_id}.0"): 1500,
            ("node2", "0", l40s, "alice", "trainer"): 2048,
            ("node2", "1", a100, "bob", "python3"): 512,
        }
        try:
            yield Served(port, {k: v * MIB for k, v in memory.items()}, uuids)
        finally:
            metrics.close()


def test_the_table_names_each_holder_beside_its_gpus_power(served: Served) -> None:
    queries = panel_queries()
    assert set(queries) == {"A", "B"}
    power = recorded_power()
    with running(targets={"gpubot": f"127.0.0.1:{served.port}"}) as prom:
        memory = rows(prom.answer(queries["A"]))
        joined = rows(prom.answer(queries["B"]))
        bare = prom.answer(without_relabel(queries["B"]))
    assert memory == served.memory
    # each holder of a GPU dcgm-exporter reads power for, beside that GPU's power; none for a
    # GPU it does not know (node1 GPU 1) or reads no power of (the A100 sample)
    want = {k: power[k[2]] for k in served.memory if k[2] in power}
    assert want == joined and len(joined) == 3
    assert {k[4] for k in joined} == {"docker:train-llama", "torchrun", "trainer"}
    # control: the same join without the rename of UUID to uuid meets nothing
    assert bare == []


def test_a_prometheus_that_renames_the_label_joins_without_label_replace(
    served: Served,
) -> None:
    snippet = DEPLOY / "prometheus-dcgm-relabel.yml"
    check = subprocess.run(
        [need("promtool", "prometheus"), "check", "config", str(snippet)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    (job,) = yaml.safe_load(snippet.read_text())["scrape_configs"]
    rules = job["metric_relabel_configs"]
    bare = without_relabel(panel_queries()["B"])
    power = recorded_power()
    target = {"gpubot": f"127.0.0.1:{served.port}"}
    with running(targets=target, relabel=rules) as prom:
        joined = rows(prom.answer(bare))
    assert joined == {k: power[k[2]] for k in served.memory if k[2] in power}
