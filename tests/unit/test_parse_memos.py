"""What a ``status all`` works out once and then remembers (issue 24): the workload of a cgroup
text (``core.probe.fields``) and a snapshot's GPU flags (``core.flags.flags_of``). Remembered
answers are the answers worked out afresh, and the memory they take is bounded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpubot.core.flags import flags_of, gpu_flags
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.core.probe import fields as probe_fields
from gpubot.core.probe.fields import CGROUP_TEXTS, parse_proc_lines
from gpubot.core.workload import Workload, parse_cgroup

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
TEXTS = [
    (CORPUS / s["file"]).read_text(encoding="utf-8").rstrip("\n")
    for s in json.loads((CORPUS / "index.json").read_text(encoding="utf-8"))
    if s["parser"] == "cgroup"
]


def esc(text: str) -> str:
    """The probe's escaped form of ``text``."""
    raw = text.encode()
    return "=" + "".join(chr(c) if 0x21 <= c <= 0x7E and c != 0x5C else f"\\{c:03o}" for c in raw)


def listing(cgroups: list[str]) -> tuple[str, list[int]]:
    """A ``procs`` section of one process a cgroup text, pids from 100."""
    lines = ["c 100 5000.0"]
    for pid, cg in enumerate(cgroups, 100):
        lines.append(f"p {pid} S 1 400000 1000 1000 =python3 =python3 ! {esc(cg)} =0")
    return "\n".join([*lines, "u 1000 =alice", ""]), list(range(100, 100 + len(cgroups)))


def bare(w: Workload | None) -> Workload | None:
    """The workload as the cgroup text alone says it: without the name the probe gave a
    rootless container's slice uid (``uid_name``, from the listing's ``u`` lines)."""
    return None if w is None else w.with_detail(uid_name=None)


def test_the_real_cgroup_samples_give_the_same_workloads_read_again() -> None:
    assert len(TEXTS) >= 20
    body, pids = listing(TEXTS)
    want = [parse_cgroup(t) for t in TEXTS]
    for _ in range(2):  # the second reading is the remembered one
        got = parse_proc_lines(body, pids)
        assert [bare(got[p].workload) for p in pids] == want
        named = {w.get("uid_name") for p in pids if (w := got[p].workload) is not None}
        assert named == {None, "alice"}  # the rootless sample's slice uid 1000 is alice
    assert any(w is not None and w.kind != "other" for w in want)


def test_the_workloads_remembered_are_bounded_and_cannot_be_changed() -> None:
    many = [f"0::/user.slice/user-1000.slice/x-{i}.scope" for i in range(CGROUP_TEXTS + 500)]
    body, pids = listing(many)
    got = parse_proc_lines(body, pids)
    assert probe_fields._workload_of.cache_info().currsize <= CGROUP_TEXTS
    # Past the bound each text is still worked out whole: the first texts, forgotten by now.
    again = parse_proc_lines(*listing(many[:3]))
    assert [again[p].workload for p in (100, 101, 102)] == [got[p].workload for p in pids[:3]]
    w = got[pids[0]].workload
    assert w is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.id = "another"  # type: ignore[misc]


def gpu(index: int, used: int | None, **kw: object) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", "H200", used, 143771, 0, **kw)  # type: ignore[arg-type]


def test_a_snapshots_flags_are_worked_out_once_and_follow_its_gpus() -> None:
    snap = NodeSnapshot("n1", 0.0, (gpu(0, 8192), gpu(1, 0, minor=1)))
    assert flags_of(snap, snap.gpus[0]) == gpu_flags(snap.gpus[0], ())
    assert "no-process-memory" in flags_of(snap, snap.gpus[0])
    assert flags_of(snap, snap.gpus[0]) is flags_of(snap, snap.gpus[0])  # remembered
    # A snapshot with other GPUs (the sweep's health attached, memory freed) has flags of its own.
    lost = dataclasses.replace(snap, gpus=(gpu(0, None, flags=("lost",)), snap.gpus[1]))
    assert flags_of(lost, lost.gpus[0]) == ("lost", "device-file-unknown")
    assert "no-process-memory" in flags_of(snap, snap.gpus[0])
    # A GPU that is not the snapshot's own, at a known index, is not given the remembered flags.
    other = gpu(0, 0, minor=0)
    assert flags_of(snap, other) == gpu_flags(other, ()) == ()


def test_a_hostile_flood_of_cgroups_changes_no_one_elses_workload() -> None:
    """A user may name cgroups in their own subtree at will, a newline included (a forged line):
    a flood of such texts past the bound only costs CPU. A forged text stays untrusted when read
    again, and every real sample read after the flood gets what ``parse_cgroup`` gives it."""
    forged = "0::/user.slice/user-1000.slice/x.scope/a\n0::/system.slice/docker-" + "ab" * 32
    flood = [f"{forged}{i}.scope" for i in range(CGROUP_TEXTS + 100)]
    body, pids = listing([flood[0], *flood, flood[0]])
    got = parse_proc_lines(body, pids)
    for p in (pids[0], pids[-1]):  # the first reading, and the same text after the flood
        w = got[p].workload
        assert w is not None and w.kind == "other" and w.get("untrusted") == "yes"
    after = parse_proc_lines(*listing(TEXTS))
    assert [bare(after[p].workload) for p in range(100, 100 + len(TEXTS))] == [
        parse_cgroup(t) for t in TEXTS
    ]
