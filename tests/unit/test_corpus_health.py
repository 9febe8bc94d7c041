"""gpubot's health readers on real ``nvidia-smi -q`` sections and ``nvlink -s`` answers
(tests/corpus/health/, sources in index.json): each sample with the answer it implies."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpubot.core.health.findings import HealthMemory, find_health
from gpubot.core.health.nvlink import expect_links
from gpubot.core.health.query import parse_q_health
from gpubot.core.health.state import GpuHealth, Links, NodeHealth, parse_nvlink
from gpubot.core.models import GpuInfo, NodeSnapshot
from tests.fixtures.corpus import by_parser, text_of


@pytest.mark.parametrize("sample", by_parser("health_q"))
def test_query_sections(sample: dict[str, Any]) -> None:
    want = sample["expect"]
    h = parse_q_health(text_of(sample))
    assert list(h.flags()) == want["flags"]
    for name, value in want.items():
        if name != "flags":
            assert getattr(h, name) == value, name


_NAME = re.compile(r"GPU (\d+): (.+?) \(UUID: ")
PEER = 99  # the fabric peer a sample's context adds


def _nvlink_sweep(text: str, context: dict[str, Any]) -> tuple[NodeSnapshot, NodeHealth]:
    """The sample's GPUs as one node's sweep, with its context: the links each GPU was seen
    with up before (``seen_up``), a peer of its model in an NVSwitch fabric (``fabric_peer_up``)."""
    names = {int(m[1]): m[2] for m in _NAME.finditer(text)}
    links = parse_nvlink(text)
    fabric = "fabric_peer_up" in context
    state = "Completed" if fabric else None
    gpus = {g: GpuHealth(g, links=v, fabric_state=state) for g, v in links.items()}
    info = [GpuInfo(g, f"GPU-{g}", names[g], 0, 1, 0) for g in links]
    if fabric:
        gpus[PEER] = GpuHealth(
            PEER, links=Links(tuple(context["fabric_peer_up"])), fabric_state=state
        )
        info.append(GpuInfo(PEER, f"GPU-{PEER}", names[min(links)], 0, 1, 0))
    return NodeSnapshot("n", 0.0, tuple(info)), NodeHealth(gpus)


def _judged(
    sample: dict[str, Any], context: dict[str, Any]
) -> tuple[dict[str, list[str]], set[str]]:
    """Return each sample GPU's flags and the kinds found, read as one sweep in ``context``."""
    snap, health = _nvlink_sweep(text_of(sample), context)
    seen = {("n", f"GPU-{g}"): tuple(v) for g, v in context.get("seen_up", {}).items()}
    judged = expect_links("n", snap.gpus, health, seen)
    flags = {str(g): list(h.flags()) for g, h in judged.gpus.items() if g != PEER}
    found, _ = find_health([snap], {"n": health}, HealthMemory(links=seen))
    return flags, {f.kind.value for f in found}


@pytest.mark.parametrize("sample", by_parser("nvlink"))
def test_nvlink_status(sample: dict[str, Any]) -> None:
    """What ``nvlink -s`` lists, and what it means alone (the first reading, no fabric) and in the
    sample's context (the same answer after a healthy one, or beside a fabric peer)."""
    want = sample["expect"]
    links = parse_nvlink(text_of(sample))
    assert {str(g): list(v.down) for g, v in links.items()} == want["inactive"]
    assert sorted(str(g) for g, v in links.items() if v.all_inactive) == want.get(
        "all_inactive", []
    )
    flags, kinds = _judged(sample, {})
    assert flags == want["flags"] and kinds == set()
    if "context" in want:
        flags, kinds = _judged(sample, want["context"])
        assert flags == want["flags_in_context"]
        assert kinds == {"nvlink-down"}


def _finds(h: GpuHealth) -> list[str]:
    snap = NodeSnapshot("n", 0.0, (GpuInfo(h.index, f"GPU-{h.index}", "X", 0, 1, 0),))
    found, _ = find_health([snap], {"n": NodeHealth({h.index: h})}, HealthMemory())
    return [f.kind.value for f in found]


@pytest.mark.parametrize("sample", by_parser("health_q", "nvlink"))
def test_each_sample_finds_what_it_implies(sample: dict[str, Any]) -> None:
    """The samples' findings on their first sweep (throttling needs a second one)."""
    text = text_of(sample)
    if sample["parser"] == "nvlink":  # alone, nothing says which links are wired
        kinds = [k for g, v in parse_nvlink(text).items() for k in _finds(GpuHealth(g, links=v))]
        assert kinds == []
        return
    kinds = _finds(parse_q_health(text))
    flags = sample["expect"]["flags"]
    assert ("fabric-not-ready" in kinds) == ("fabric-not-ready" in flags)
    assert "gpu-throttled" not in kinds  # a moment is not a finding
