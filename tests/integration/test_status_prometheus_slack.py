"""``/gpu status all`` in Slack on a fleet whose "odd" group reads Prometheus (issue 38).

The same summary as ``gpubot status --summary`` (``StatusService.summary``), reached through
signed HTTP requests into the bot as ``gpubot serve`` builds it (``gpubot.app.build``): the real
Prometheus scrapes the corpus's recorded dcgm-exporter texts, each relabelled to one of the
simulated fleet's odd nodes, and the even nodes, and any node Prometheus cannot vouch for, are
probed over real SSH.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.prometheus import Prometheus, dcgm_samples, dcgm_truth, running
from tests.fixtures.slack import (
    FakeSlack,
    assert_within_limits,
    running_bot,
    slack_settings_for,
    workload_owner,
)
from tests.fixtures.slack_flows import blocks_of

ODD = ("cncf-ericsson-ccd-t4", "cncf-upcloud-l40s")  # the samples the odd nodes serve
PROM_HEADER = ["NODE", "GPUS", "IN USE", "MEMORY GiB", "UTIL %", "LAST XID", "DATA AGE"]


@pytest.fixture(scope="module")
def odd_prometheus(sim_fleet: SimFleet) -> Iterator[Prometheus]:
    odd = [n.name for n in sim_fleet.nodes if (n.index + 1) % 2]
    with running(dict(zip(ODD, odd, strict=True))) as prom:
        yield prom


def settings(fleet: SimFleet, tmp: Path, url: str, max_age_s: float = 120) -> Any:
    text = fleet.config_path.read_text()
    text += f'\n[groups.odd]\ntelemetry = "prometheus"\n\n[prometheus]\nurl = "{url}"\n'
    text += f"max_age_s = {max_age_s}\n"
    path = tmp / "gpubot.toml"
    path.write_text(text)
    return slack_settings_for(path, workload_owner(fleet))


async def status_all(settings: Any, fake: FakeSlack, tmp: Path) -> dict[str, Any]:
    """Send ``/gpu status all`` signed, as U0OWNER; return the answer (the last update)."""
    async with running_bot(settings, fake, f"sqlite:///{tmp}/audit.db") as harness:
        reply = await harness.send.command("status all")
        assert reply.status == 200 and reply.text == ""
        await harness.settle()
        (query,) = await harness.store.queries()
        names = sorted(n.name for n in settings.nodes)
        assert query.source == "slack" and sorted(query.data["nodes"]) == names
    assert_within_limits(fake)
    update = fake.of("chat.update")[-1]
    return {"text": update.body["text"], "blocks": blocks_of(update)}


def tables(answer: dict[str, Any]) -> list[list[list[str]]]:
    return [
        [[c["text"] for c in r] for r in b["rows"]]
        for b in answer["blocks"]
        if b["type"] == "table"
    ]


def contexts(answer: dict[str, Any]) -> list[str]:
    return [
        "".join(e.get("text", "") for e in b["elements"])
        for b in answer["blocks"]
        if b["type"] == "context"
    ]


def pre_text(answer: dict[str, Any]) -> str:
    return "\n".join(b["text"]["text"] for b in answer["blocks"] if b["type"] == "section")


async def test_status_all_shows_the_odd_nodes_from_prometheus_with_their_age(
    sim_fleet: SimFleet, odd_prometheus: Prometheus, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    answer = await status_all(
        settings(sim_fleet, tmp_path, odd_prometheus.url), fake_slack, tmp_path
    )
    (prom_table,) = [t for t in tables(answer) if t[0] == PROM_HEADER]
    hosts, samples = dict(odd_prometheus.hosts), dcgm_samples()
    want = {}
    for job in ODD:
        gpus = next(iter(dcgm_truth(samples[job]).values())).values()
        used = sum(g["used"] for g in gpus)
        total = sum(g["total"] for g in gpus)
        busy = sum(1 for g in gpus if g["used"] > 0)
        want[hosts[job]] = [str(len(gpus)), str(busy), f"{used / 1024:.1f} / {total / 1024:.1f}"]
    got = {r[0]: r[1:4] for r in prom_table[1:]}
    assert got == want
    ages = [int(r[6].removesuffix(" s")) for r in prom_table[1:]]
    assert all(0 <= a < 30 for a in ages)
    # the even nodes answered over SSH: only theirs are probed and shown with their GPUs
    even = sorted({n.name for n in sim_fleet.nodes} - set(want))
    shown = pre_text(answer)
    assert all(f"{n} · 8 × " in shown for n in even) and not any(f"{n} · " in shown for n in want)
    assert "4 node(s) OK, 0 failing" in answer["text"]
    assert "from Prometheus: 2 node(s)" in answer["text"]
    assert not any("read over SSH" in c for c in contexts(answer))


async def test_control_stale_answers_are_read_over_ssh_with_one_line(
    sim_fleet: SimFleet, odd_prometheus: Prometheus, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    cfg = settings(sim_fleet, tmp_path, odd_prometheus.url, max_age_s=0.001)
    answer = await status_all(cfg, fake_slack, tmp_path)
    assert not [t for t in tables(answer) if t[0] == PROM_HEADER]
    (note,) = [c for c in contexts(answer) if "read over SSH" in c]
    assert "older than 0.001 s, for 2 node(s)" in note and note.startswith("⚠ prometheus http")
    assert "4 node(s) OK, 0 failing" in answer["text"] and "Prometheus" not in answer["text"]


async def test_prometheus_unreachable_is_read_over_ssh_with_one_line(
    sim_fleet: SimFleet, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    answer = await status_all(
        settings(sim_fleet, tmp_path, f"http://127.0.0.1:{port}"), fake_slack, tmp_path
    )
    (note,) = [c for c in contexts(answer) if "read over SSH" in c]
    assert note.startswith(f"⚠ prometheus http://127.0.0.1:{port}: no connection")
    assert note.endswith("2 node(s) read over SSH") and "4 node(s) OK" in answer["text"]
