"""The list of runtimes (gpubot/core/runtimes/): one module per runtime, iterated by all."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpubot.config import nodes
from gpubot.core import enrich, workload
from gpubot.core.runtimes import LOOKUPS, RUNTIMES, _check, find_runtime, runtime_of
from gpubot.core.runtimes.base import Rank, Shape
from gpubot.core.workload import match_path, workload_from_dict

PKG = Path(__file__).resolve().parents[2] / "gpubot"
CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "cgroup"


def test_the_list_holds_every_kind_once_other_last() -> None:
    kinds = [r.kind for r in RUNTIMES]
    assert {"docker", "podman", "kubernetes", "slurm", "lxc", "service", "session"} <= set(kinds)
    assert kinds[-1] == "other" and len(set(kinds)) == len(kinds)
    assert runtime_of("slurm") is find_runtime("slurm") and find_runtime("k8s") is None


def test_a_stored_workload_of_no_listed_kind_is_refused() -> None:
    w = workload_from_dict({"kind": "docker", "id": "a", "detail": [["image", "x"]]})
    assert w is not None and w.kind == "docker" and w.get("image") == "x"
    with pytest.raises(ValueError, match="'k8s' is not a workload kind"):
        workload_from_dict({"kind": "k8s", "id": "a"})


def test_config_and_lookups_iterate_the_list() -> None:
    assert nodes.RUNTIMES == enrich.RUNTIMES == ("docker", "podman", "slurm", "crictl")
    assert tuple(LOOKUPS) == nodes.RUNTIMES


def _samples() -> list[str]:
    paths = []
    for f in sorted(CORPUS.iterdir()):
        for line in f.read_text(encoding="utf-8").splitlines():
            path = line.split(":", 2)[2] if f.suffix == ".txt" and ":" in line else line
            paths.append(re.sub(r"^/sys/fs/cgroup(?:/[^/]*(?=/))?", "", path.rstrip("/")))
    return [p for p in paths if p.startswith("/")]


def test_shapes_of_one_rank_never_claim_the_same_path() -> None:
    """Within a rank the runtimes' order decides nothing: no two runtimes' shapes of the rank
    that wins both match a real path (so a new module cannot take another runtime's paths)."""
    samples = _samples()
    assert len(samples) >= 30
    ranked = [
        (kind, s.rank, re.compile(s.pattern + r"\Z")) for kind, s in workload.ordered(RUNTIMES)
    ]
    for path in samples:
        hits = [(rank, kind) for kind, rank, p in ranked if p.match(path)]
        if hits:
            best = min(rank for rank, _ in hits)
            assert len({k for r, k in hits if r == best}) == 1, (path, hits)


def test_the_table_is_ranked() -> None:
    ranks = [s.rank for _, s in workload.ordered(RUNTIMES)]
    assert ranks == sorted(ranks) and ranks[-1] is Rank.SERVICE
    assert match_path("/system.slice/containerd.service").get("reason") == (
        "runtime daemon's own unit"
    )


def test_the_list_refuses_what_would_be_ambiguous() -> None:
    docker = next(r for r in RUNTIMES if r.kind == "docker")
    _check(RUNTIMES)
    with pytest.raises(ValueError, match="kind given twice: docker"):
        _check((*RUNTIMES, docker))
    with pytest.raises(ValueError, match="lookup tool given twice: docker"):
        _check((*RUNTIMES, replace(docker, kind="docker2")))
    with pytest.raises(ValueError, match="reason_ group"):
        _check((replace(docker, shapes=(Shape("/x", reason="why"),)),))
    with pytest.raises(ValueError, match="not a process name"):
        _check((replace(docker, root_helpers=("a b",)),))


# A switch over runtime kinds: a kind compared with the name of a runtime (but the fallback other).
_KINDS = "|".join(re.escape(r.kind) for r in RUNTIMES if r.kind != "other")
SWITCH = re.compile(rf"kind\b[^\n]{{0,12}}(?:==|!=|\bin\b)[^\n]{{0,40}}[\"'](?:{_KINDS})[\"']")


def test_no_runtime_switch_outside_the_runtime_modules() -> None:
    bad = [
        f"{p.relative_to(PKG)}:{n}"
        for p in sorted(PKG.rglob("*.py"))
        if "runtimes" not in p.parts and "sim" not in p.parts
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if SWITCH.search(line)
    ]
    assert bad == []


@pytest.mark.parametrize(
    "line",
    [
        '    if w.kind == "slurm":',
        '    if w is None or w.kind in ("session", "other"):',
        '    elif kind == "docker":',
    ],
)
def test_control_the_switch_rule_sees_the_old_switches(line: str) -> None:
    assert SWITCH.search(line)
