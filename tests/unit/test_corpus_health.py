"""gpubot's health readers on real ``nvidia-smi -q`` sections and ``nvlink -s`` answers
(tests/corpus/health/, sources in index.json): each sample with the answer it implies."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.core.health.findings import HealthMemory, find_health
from gpubot.core.health.query import parse_q_health
from gpubot.core.health.state import GpuHealth, NodeHealth, parse_nvlink
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


@pytest.mark.parametrize("sample", by_parser("nvlink"))
def test_nvlink_status(sample: dict[str, Any]) -> None:
    want = sample["expect"]
    links = parse_nvlink(text_of(sample))
    assert {str(g): list(v.down) for g, v in links.items()} == want["down"]
    flags = {str(g): list(GpuHealth(g, links=v).flags()) for g, v in links.items()}
    assert flags == want["flags"]


def _finds(h: GpuHealth) -> list[str]:
    snap = NodeSnapshot("n", 0.0, (GpuInfo(h.index, f"GPU-{h.index}", "X", 0, 1, 0),))
    found, _ = find_health([snap], {"n": NodeHealth({h.index: h})}, HealthMemory())
    return [f.kind.value for f in found]


@pytest.mark.parametrize("sample", by_parser("health_q", "nvlink"))
def test_each_sample_finds_what_it_implies(sample: dict[str, Any]) -> None:
    """The samples' findings on their first sweep (throttling needs a second one)."""
    text = text_of(sample)
    if sample["parser"] == "nvlink":
        kinds = [k for g, v in parse_nvlink(text).items() for k in _finds(GpuHealth(g, links=v))]
        assert bool(kinds) == any(sample["expect"]["down"].values())
        assert set(kinds) <= {"nvlink-down"}
        return
    kinds = _finds(parse_q_health(text))
    flags = sample["expect"]["flags"]
    assert ("fabric-not-ready" in kinds) == ("fabric-not-ready" in flags)
    assert "gpu-throttled" not in kinds  # a moment is not a finding
