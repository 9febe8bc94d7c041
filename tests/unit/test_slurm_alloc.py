"""Allocation beside use on a node Slurm owns (issue 36): flags, notes and findings from a
snapshot and Slurm's view of it. Evidence that names a person is that person's own: an unused
allocation counts from when that job was first seen not using that GPU, never from before."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gpubot.core.claims.rules import free_gpus
from gpubot.core.flags import flags_of, node_notes
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.slurm import GresMap, JobAlloc, NodeState, SlurmSettings, SlurmView
from gpubot.core.slurm.alloc import gpu_dict, unsure
from gpubot.core.slurm.findings import ALLOCATED_UNUSED, NODE_DRAINED, OUTSIDE_SLURM
from gpubot.core.workload import Workload
from gpubot.services.slurm_watch import SlurmWatch

T0 = 1_800_000_000.0
WINDOW = 1800.0


def gpu(i: int, minor: int | None = None) -> GpuInfo:
    return GpuInfo(i, f"GPU-{i}", "H100", 0, 81559, 0, minor=i if minor is None else minor)


def proc(pid: int, g: int, user: str, job: str | None = None) -> GpuProcess:
    w = None if job is None else Workload("slurm", job)
    return GpuProcess(
        pid, g, 4096, "python3", True, True, user=user, start_ticks=pid * 10, workload=w
    )


def job(jid: str, user: str, idx: tuple[int, ...], start: float = T0 - 60) -> JobAlloc:
    return JobAlloc(jid, user, "train", "RUNNING", idx, start=start, end=T0 + 3600)


def view(
    *jobs: JobAlloc,
    states: tuple[str, ...] = ("MIXED",),
    minors: tuple[int, ...] = (0, 1, 2),
    proven: bool = True,
    reason: str | None = None,
) -> SlurmView:
    node = NodeState("n1", states, reason, "root", T0 - 7200 if reason else None)
    return SlurmView(node, jobs, T0, "scontrol --json", gres=GresMap(minors, proven))


def snap(procs: tuple[GpuProcess, ...], v: SlurmView | None, at: float = T0) -> NodeSnapshot:
    return NodeSnapshot("n1", at, (gpu(0), gpu(1), gpu(2)), procs, slurm=v)


# Job 12 of alice is allocated GPUs 0 and 1 and runs on 0; bob runs on GPU 2 outside Slurm.
PROCS = (proc(100, 0, "alice", "12"), proc(200, 2, "bob"))


def test_flags_show_an_unused_allocation_and_use_outside_slurm() -> None:
    s = snap(PROCS, view(job("12", "alice", (0, 1))))
    assert [flags_of(s, g) for g in s.gpus] == [(), ("allocated-unused",), ("outside-slurm",)]
    assert "Slurm job 12 (alice, train): GPU 0, 1, 1 h left" in node_notes(s)


def test_control_without_a_scheduler_nothing_is_said() -> None:
    s = snap(PROCS, None)
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ()]
    assert not any("Slurm" in n for n in node_notes(s))


def test_the_map_goes_by_device_minor_not_index() -> None:
    # GRES index 0 is minor 2 (gres.conf lists /dev/nvidia2 first): GPU 2 is job 12's.
    s = snap((proc(200, 2, "alice", "12"),), view(job("12", "alice", (0,)), minors=(2, 0, 1)))
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ()]
    s = snap((), view(job("12", "alice", (0,)), minors=(2, 0, 1)))
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ("allocated-unused",)]


def test_an_unproven_map_says_so() -> None:
    s = snap(PROCS, view(job("12", "alice", (0, 1)), proven=False))
    assert any("gres.conf does not prove the map" in n for n in node_notes(s))


def findings(w: SlurmWatch, s: NodeSnapshot, at: float) -> list[tuple[object, ...]]:
    found = asyncio.run(w.findings([s], at))
    return [(f.kind, f.gpu, f.holder, f.owner) for f in found]


def test_an_unused_allocation_is_found_once_the_window_has_passed() -> None:
    w = SlurmWatch(SlurmSettings(unused_after_s=WINDOW))
    s = snap(PROCS, view(job("12", "alice", (0, 1))))
    outside = (OUTSIDE_SLURM, 2, "200:2000", "bob")
    assert findings(w, s, T0) == [outside]
    assert findings(w, s, T0 + WINDOW - 1) == [outside]
    assert findings(w, s, T0 + WINDOW) == [(ALLOCATED_UNUSED, 1, "job:12", "alice"), outside]


def test_use_ends_the_window_and_a_later_lapse_starts_a_new_one() -> None:
    w = SlurmWatch(SlurmSettings(unused_after_s=WINDOW))
    unused = snap(PROCS, view(job("12", "alice", (0, 1))))
    used = snap((*PROCS, proc(101, 1, "alice", "12")), view(job("12", "alice", (0, 1))))
    findings(w, unused, T0)
    findings(w, used, T0 + WINDOW / 2)  # it used GPU 1 for a while
    assert (ALLOCATED_UNUSED, 1, "job:12", "alice") not in findings(w, unused, T0 + WINDOW)
    assert (ALLOCATED_UNUSED, 1, "job:12", "alice") in findings(w, unused, T0 + 2 * WINDOW)


def test_two_jobs_in_turn_each_counts_only_its_own_time() -> None:
    """Job 12 (alice) left GPU 1 unused for most of the window, then ended; job 13 (carol) got
    GPU 1 and has not used it yet: carol is not accused on alice's time."""
    w = SlurmWatch(SlurmSettings(unused_after_s=WINDOW))
    findings(w, snap(PROCS, view(job("12", "alice", (0, 1)))), T0)
    later = T0 + WINDOW - 60
    v = view(job("12", "alice", (0,)), job("13", "carol", (1,), start=later))
    assert findings(w, snap(PROCS, v, later), later)[:1] == [(OUTSIDE_SLURM, 2, "200:2000", "bob")]
    at = T0 + WINDOW + 60
    assert (ALLOCATED_UNUSED, 1, "job:13", "carol") not in findings(w, snap(PROCS, v, at), at)
    at = later + WINDOW
    assert (ALLOCATED_UNUSED, 1, "job:13", "carol") in findings(w, snap(PROCS, v, at), at)


def test_a_process_of_another_job_is_outside_the_allocation() -> None:
    v = view(job("12", "alice", (0, 1)), job("99", "dave", (2,)))
    s = snap((proc(300, 1, "dave", "99"),), v)
    found = asyncio.run(SlurmWatch(SlurmSettings()).findings([s], T0))
    (f,) = [f for f in found if f.kind == OUTSIDE_SLURM]
    assert (f.gpu, f.owner, f.pid) == (1, "dave", 300)
    assert "in job 99, not allocated it" in f.summary


def test_a_process_of_a_job_missing_from_the_answer_is_not_accused() -> None:
    """Job 99 started (or ended) between the probe and Slurm's answer, or the answer left it
    out: its process may well be on its own GPU. One in no job at all still is outside."""
    s = snap((proc(300, 1, "dave", "99"), proc(200, 2, "bob")), view(job("12", "alice", (0, 1))))
    unused = ("allocated-unused",)
    assert [flags_of(s, g) for g in s.gpus] == [unused, unused, ("outside-slurm",)]


def test_an_array_task_is_matched_by_its_own_job_id() -> None:
    """Array task 40_7's own job id is 42, and its cgroup is job_42: its process on its GPU is
    its own (the control: matched by the task's name, its GPU would be called unused)."""
    task = JobAlloc("40_7", "ada", "sweep", "RUNNING", (1,), own_id="42")
    s = snap((proc(300, 1, "ada", "42"),), view(task))
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ()]
    control = snap((proc(300, 1, "ada", "42"),), view(replace(task, own_id=None)))
    assert flags_of(control, control.gpus[1]) == ("allocated-unused",)


def test_status_json_says_used_only_with_proof() -> None:
    s = snap(PROCS, view(job("12", "alice", (0, 1))))
    assert [(gpu_dict(s, g) or {})["used"] for g in s.gpus[:2]] == [True, False]
    vague = snap(PROCS, view(job("12", "alice", (0, 1)), proven=False))
    assert [(gpu_dict(vague, g) or {})["used"] for g in vague.gpus[:2]] == [None, None]


def test_claims_see_no_free_gpu_while_the_allocation_cannot_be_told() -> None:
    s = snap((), view(job("12", "alice", (0,))))
    assert free_gpus(s, (), 256) == (1, 2) and unsure(s) is None
    for bad in (
        replace(view(), error="timed out"),
        view(job("12", "alice", (0,)), proven=False),
        view(JobAlloc("9", "x", "y", "RUNNING", (), gpu_unknown=True)),
    ):
        vague = snap((), bad)
        assert free_gpus(vague, (), 256) == () and unsure(vague) is not None


def test_a_drained_node_is_found_with_its_reason_and_age() -> None:
    v = view(states=("IDLE", "DRAIN"), reason="Xid 79 GPU 5")
    found = asyncio.run(SlurmWatch(SlurmSettings()).findings([snap((), v)], T0))
    assert [(f.kind, f.gpu) for f in found] == [(NODE_DRAINED, None)]
    assert found[0].summary == "Slurm holds the node idle+drain for 2 h by root: Xid 79 GPU 5"


def test_an_unreadable_view_accuses_nobody() -> None:
    v = replace(view(job("12", "alice", (0, 1))), error="scontrol: timed out")
    s = snap(PROCS, v)
    assert asyncio.run(SlurmWatch(SlurmSettings()).findings([s], T0 + 10 * WINDOW)) == []
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ()]
    assert "Slurm not read: scontrol: timed out" in node_notes(s)


def test_an_unproven_map_accuses_only_use_in_no_job_at_all() -> None:
    """By device order alone GPU 1 may not be job 12's: no unused finding, and dave's job 99
    (allocated, GPUs said) is not called outside; bob, in no job, still is."""
    procs = (*PROCS, proc(300, 1, "dave", "99"))
    v = view(job("12", "alice", (0, 1)), job("99", "dave", (2,)), proven=False)
    s = snap(procs, v)
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ("outside-slurm",)]
    control = snap(procs, replace(v, gres=GresMap((0, 1, 2), True)))
    both = ("allocated-unused", "outside-slurm")
    assert [flags_of(control, g) for g in control.gpus] == [(), both, both]


def test_a_job_whose_gpus_slurm_did_not_say_is_not_outside() -> None:
    unknown = JobAlloc("99", "dave", "x", "RUNNING", (), gpu_unknown=True)
    s = snap((proc(300, 1, "dave", "99"),), view(unknown))
    assert [flags_of(s, g) for g in s.gpus] == [(), (), ()]
    assert "Slurm job 99 (dave, x): its GPUs here not said by Slurm, no limit" in node_notes(s)
