"""Which nodes a sweep probes when Prometheus narrows it (``services.sweep_scope``), and the
folding of the candidate queries' answers (``core.telemetry.candidates``), over a scripted
Prometheus. The PromQL itself runs against a real Prometheus in
tests/integration/test_sweep_prometheus.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import Settings, load
from gpubot.core.findings import ORPHANED_VRAM, Finding
from gpubot.core.telemetry import (
    AGE,
    HELD_QUIET,
    IDLE_WINDOW,
    REMAP_PENDING,
    UNREAD,
    CandidateRule,
    PromLabels,
    candidate_queries,
    candidates,
    summarize,
)
from gpubot.errors import PrometheusFailed
from gpubot.services.sweep_scope import rule_of, scope

NODES = "".join(
    f'[[nodes]]\nname = "n{i}"\nhost = "n{i}.example"\ngroups = ["{g}"]\n\n'
    for i, g in enumerate(["dgx", "dgx", "dgx", "dgx", "ssh"])
)
NOW = 1000.0


def settings(tmp: Path, extra: str = '[prometheus]\nurl = "http://prom:9090"\n') -> Settings:
    path = tmp / "gpubot.toml"
    path.write_text(NODES + '[groups.dgx]\ntelemetry = "prometheus"\n\n' + extra)
    return load(path)


def gpu(node: str, index: int, value: float, t: float = NOW) -> dict[str, Any]:
    labels = {"Hostname": node, "UUID": f"GPU-{node}-{index}", "gpu": str(index)}
    return {"metric": {**labels, "modelName": "H100"}, "value": [t, str(value)]}


class Scripted:
    """A Prometheus that answers what the test says: every node of ``fresh`` with one GPU
    sampled ``age`` seconds ago, and ``named``'s candidate vectors."""

    url = "http://prom:9090"

    def __init__(
        self,
        fresh: Mapping[str, float],
        named: Mapping[str, list[dict[str, Any]]] | None = None,
        fail: str | None = None,
    ) -> None:
        self.fresh, self.named, self.fail = fresh, dict(named or {}), fail
        self.rules: list[CandidateRule] = []

    async def summary_vectors(self) -> Mapping[str, list[dict[str, Any]]]:
        if self.fail:
            raise PrometheusFailed(self.fail)
        out: dict[str, list[dict[str, Any]]] = {"used": [], "free": [], "util": []}
        for name, age in self.fresh.items():
            for field in ("used", "free", "util"):
                out[field].append(gpu(name, 0, 0))
            out.setdefault(AGE, []).append(gpu(name, 0, NOW - age))  # the memory's sample time
        return out

    async def candidate_vectors(self, rule: CandidateRule) -> Mapping[str, list[dict[str, Any]]]:
        self.rules.append(rule)
        return self.named

    async def close(self) -> None:
        pass


def names(nodes: Any) -> list[str]:
    return [n.name for n in nodes]


async def test_only_named_and_kept_nodes_are_probed_and_ssh_nodes_always(tmp_path: Path) -> None:
    prom = Scripted(
        {"n0": 1, "n1": 1, "n2": 1, "n3": 1},
        {HELD_QUIET: [gpu("n1", 3, 0)], REMAP_PENDING: [gpu("n1", 0, 1), gpu("other", 0, 1)]},
    )
    s = settings(tmp_path)

    async def keep() -> set[str]:
        return {"n2", "n4"}

    got = await scope(s, prom, s.nodes, keep)
    assert names(got.probe) == ["n1", "n2", "n4"]  # inventory order; n4 reads over SSH
    assert got.vouched == ("n0", "n3") and got.notes == ()
    assert got.named == {
        "n1": f"named by prometheus (GPU 0: {REMAP_PENDING}; GPU 3: {HELD_QUIET}), "
        "confirmed over ssh",
        "n2": "named by a finding or failure of an earlier sweep, confirmed over ssh",
    }
    orphan = Finding("n1", 3, ORPHANED_VRAM, "", "6144 MiB in use and no process holds it")
    other = Finding("n4", 0, ORPHANED_VRAM, "", "2048 MiB in use")
    assert [f.source for f in got.tag([orphan, other])] == [got.named["n1"], None]
    assert prom.rules == [rule_of(s)]


async def test_no_prometheus_node_asks_nothing(tmp_path: Path) -> None:
    s = settings(tmp_path)
    ssh_only = [n for n in s.nodes if n.telemetry == "ssh"]
    prom = Scripted({}, fail="must not be asked")
    got = await scope(s, prom, ssh_only)
    assert names(got.probe) == ["n4"] and got.notes == () and prom.rules == []


@pytest.mark.parametrize(
    ("prom", "note"),
    [
        (None, "no [prometheus] url: 4 node(s) swept over SSH"),
        (
            Scripted({}, fail="prometheus http://prom:9090: no connection"),
            "prometheus http://prom:9090: no connection: 4 node(s) swept over SSH",
        ),
    ],
)
async def test_without_prometheus_every_node_is_swept_with_one_line(
    tmp_path: Path, prom: Scripted | None, note: str
) -> None:
    s = settings(tmp_path)
    got = await scope(s, prom, s.nodes)
    assert names(got.probe) == names(s.nodes) and got.notes == (note,) and got.named == {}


async def test_an_answer_older_than_the_bound_is_swept_over_ssh(tmp_path: Path) -> None:
    s = settings(tmp_path, '[prometheus]\nurl = "http://prom:9090"\nmax_age_s = 30\n')
    got = await scope(s, Scripted({"n0": 1, "n1": 31, "n2": 1}), s.nodes)
    assert names(got.probe) == ["n1", "n3", "n4"] and got.vouched == ("n0", "n2")
    (note,) = got.notes
    assert note == (
        "prometheus http://prom:9090: no answer, or one older than 30 s, for 2 node(s): "
        "n1, n3: swept over SSH"
    )


def test_gpus_the_scrape_cannot_judge_are_named() -> None:
    labels = PromLabels()
    found = summarize(
        {"used": [gpu("a", 0, 10), gpu("a", 1, 10)], "util": [gpu("a", 0, 5)]}, labels
    )
    named = candidates({HELD_QUIET: [gpu("b", 2, 0), gpu("b", 10, 0)]}, labels, found)
    assert named == {
        "a": (f"GPU 1: {UNREAD}",),
        "b": (f"GPU 2: {HELD_QUIET}", f"GPU 10: {HELD_QUIET}"),
    }
    # a series without the node or a whole-number index is no GPU of a node
    bad: list[dict[str, Any]] = [
        {"metric": {"gpu": "0"}, "value": [NOW, "1"]},
        {"metric": {"Hostname": "c", "gpu": "x"}},
    ]
    assert candidates({HELD_QUIET: bad}, labels, {}) == {}


def test_the_candidate_queries_use_the_labels_the_window_and_the_threshold() -> None:
    labels = PromLabels(node="host", uuid="uuid", gpu="index", model="model")
    asked = candidate_queries(labels, CandidateRule(7200.0, 300.0, 1024))
    assert all("max by (host, uuid, index, model)" in q for q in asked.values())
    assert "[2h]" in asked[IDLE_WINDOW]
    assert "changes(DCGM_FI_DEV_XID_ERRORS[5m])" in asked["its last Xid changed"]
    assert asked[HELD_QUIET].endswith(">= 1024")
    # a window under a second is still a PromQL range
    small = candidate_queries(labels, CandidateRule(0.2, 0.2, 1))
    assert "[1s]" in small[IDLE_WINDOW] and all("[0s]" not in q for q in small.values())


def test_memory_counts_as_held_from_the_smaller_threshold(tmp_path: Path) -> None:
    s = settings(tmp_path, "[sweep]\norphan_threshold_mib = 512\nidle_min_mib = 4096\n")
    rule = rule_of(s)
    assert (rule.held_mib, rule.interval_s, rule.idle_window_s) == (
        512,
        s.sweep.interval_s,
        s.sweep.idle.window_s,
    )
