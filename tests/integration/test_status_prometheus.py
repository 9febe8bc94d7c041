"""``gpubot status --summary`` on a fleet whose "odd" group reads Prometheus (issue 38).

The real Prometheus scrapes the corpus's recorded dcgm-exporter texts, each relabelled by
Prometheus to one of the simulated fleet's node names (its text served as recorded); the other
nodes, and any node Prometheus cannot vouch for, are probed over real SSH. The CLI runs as a
real process.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.prometheus import Prometheus, dcgm_samples, dcgm_truth, running

ODD = ("cncf-ericsson-ccd-t4", "cncf-upcloud-l40s")  # the samples the odd nodes serve


@pytest.fixture(scope="module")
def odd_prometheus(sim_fleet: SimFleet) -> Iterator[Prometheus]:
    odd = [n.name for n in sim_fleet.nodes if (n.index + 1) % 2]
    with running(dict(zip(ODD, odd, strict=True))) as prom:
        yield prom


def config(fleet: SimFleet, tmp: Path, url: str, max_age_s: float = 120) -> Path:
    text = fleet.config_path.read_text()
    text += f'\n[groups.odd]\ntelemetry = "prometheus"\n\n[prometheus]\nurl = "{url}"\n'
    text += f"max_age_s = {max_age_s}\n"
    path = tmp / "gpubot.toml"
    path.write_text(text)
    return path


def summary(path: Path) -> tuple[dict[str, Any], str]:
    doc = json.loads(gpubot_cli(path, "status", "all", "--summary", "--json").stdout)
    text = gpubot_cli(path, "status", "all", "--summary")
    return doc, text.stdout + text.stderr


def test_the_odd_nodes_are_read_from_prometheus_as_their_exporters_said(
    sim_fleet: SimFleet, odd_prometheus: Prometheus, tmp_path: Path
) -> None:
    doc, text = summary(config(sim_fleet, tmp_path, odd_prometheus.url))
    hosts = dict(odd_prometheus.hosts)
    samples = dcgm_samples()
    want = {
        hosts[job]: {
            uuid: (g["gpu"], g["used"], g["total"], g["util"])
            for uuid, g in next(iter(dcgm_truth(samples[job]).values())).items()
        }
        for job in ODD
    }
    got = {
        n["node"]: {
            g["uuid"]: (
                g["index"],
                g["memory_used_mib"],
                g["memory_total_mib"],
                g["utilization_pct"],
            )
            for g in n["gpus"]
        }
        for n in doc["prometheus"]
    }
    assert got == want and doc["notes"] == []
    assert all(0 <= n["age_s"] < 30 for n in doc["prometheus"])
    # the even nodes answered over SSH, their 8 GPUs each as the simulated fleet has them
    even = {n.name for n in sim_fleet.nodes} - set(want)
    assert {n["name"] for n in doc["nodes"]} == even
    assert all(len(n["gpus"]) == 8 for n in doc["nodes"])
    assert "DATA AGE" in text and "4/4 nodes answered (2 from Prometheus)" in text


def test_control_data_older_than_the_bound_is_read_over_ssh_with_one_line(
    sim_fleet: SimFleet, odd_prometheus: Prometheus, tmp_path: Path
) -> None:
    doc, text = summary(config(sim_fleet, tmp_path, odd_prometheus.url, max_age_s=0.001))
    assert doc["prometheus"] == [] and len(doc["nodes"]) == 4  # every node over SSH
    (note,) = doc["notes"]
    assert "older than 0.001 s, for 2 node(s)" in note and note.endswith("read over SSH")
    assert text.count("read over SSH") == 1 and "4/4 nodes answered in" in text


def test_prometheus_unreachable_is_read_over_ssh_with_one_line(
    sim_fleet: SimFleet, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    doc, text = summary(config(sim_fleet, tmp_path, f"http://127.0.0.1:{port}"))
    assert doc["prometheus"] == [] and len(doc["nodes"]) == 4
    (note,) = doc["notes"]
    assert note.startswith(f"prometheus http://127.0.0.1:{port}: no connection")
    assert note.endswith("2 node(s) read over SSH") and "Traceback" not in text
