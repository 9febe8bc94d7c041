"""Allocation beside use: which job Slurm gave each GPU, and who is on it.

Pure. A GPU's job is found by its device minor through the view's GRES map (never by its
index). A process is the job's own when its cgroup names that job (``core.runtimes.slurm``):
what a process says of itself (argv, environment) never counts.
"""

from __future__ import annotations

from gpubot.core import durations
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.runtimes.slurm import job_of
from gpubot.core.slurm import JobAlloc, SlurmView
from gpubot.core.text import one_line

ALLOCATED_UNUSED = "allocated-unused"  # the flag of a GPU its job does not use
OUTSIDE_SLURM = "outside-slurm"  # the flag of a GPU a process of no job of it holds


def gpu_job(snap: NodeSnapshot, g: GpuInfo) -> JobAlloc | None:
    """Return the job Slurm allocated ``g`` to, if the node is Slurm's and one is."""
    return snap.slurm.on_gpu(g.minor) if snap.slurm is not None and readable(snap.slurm) else None


def job_id_of(p: GpuProcess) -> str | None:
    """Return the Slurm job a process runs in, by its cgroup; None: in none."""
    return job_of(p.workload)


def of_job(p: GpuProcess, job: JobAlloc) -> bool:
    return job_id_of(p) == job.cgroup_id


def outsiders(snap: NodeSnapshot, g: GpuInfo) -> tuple[GpuProcess, ...]:
    """Return the processes on ``g`` that no job allocated ``g`` runs (a Slurm node's only).

    A process in no job at all is outside whatever the map. One in a job is outside only when
    the map is proven, Slurm listed that job here and said its GPUs: a job missing from the
    answer (it started or ended between the probe and the read, or the answer left it out) or
    one whose GPUs were not said may well be on its own GPU."""
    view = snap.slurm
    if view is None or not readable(view) or g.minor is None:
        return ()
    job = gpu_job(snap, g)
    jobs = {j.cgroup_id: j for j in view.jobs}
    out = []
    for p in snap.on_gpu(g.index):
        if p.system or not p.exists or (job is not None and of_job(p, job)):
            continue
        own = job_id_of(p)
        theirs = None if own is None else jobs.get(own)
        if own is None or (proven(view) and theirs is not None and not theirs.gpu_unknown):
            out.append(p)
    return tuple(out)


def unused(snap: NodeSnapshot, g: GpuInfo) -> JobAlloc | None:
    """Return the job allocated ``g`` that has no process of its own on it (a proven map
    only: by device order alone, the unused GPU could be another)."""
    job = gpu_job(snap, g)
    if job is None or job.state != "RUNNING" or not proven(snap.slurm):
        return None
    return None if any(of_job(p, job) for p in snap.on_gpu(g.index)) else job


def unsure(snap: NodeSnapshot) -> str | None:
    """Why Slurm's allocation of the node's GPUs cannot be told now (None: it can, or the node
    has no scheduler): a read that failed, an unproven map, a job whose GPUs were not said."""
    view = snap.slurm
    if view is None:
        return None
    if not readable(view):
        return view.error or "Slurm did not answer for the node"
    if not proven(view):
        return "gres.conf does not prove which GPU is which"
    vague = next((j for j in view.jobs if j.gpu_unknown), None)
    return None if vague is None else f"Slurm did not say which GPUs job {vague.job_id} holds"


def proven(view: SlurmView | None) -> bool:
    return view is not None and view.gres is not None and view.gres.proven


def readable(view: SlurmView | None) -> bool:
    """Whether ``view`` says anything (read without error, the node known, a GRES map)."""
    return (
        view is not None and view.error is None and view.node is not None and view.gres is not None
    )


def flags(snap: NodeSnapshot, g: GpuInfo) -> tuple[str, ...]:
    out = []
    if unused(snap, g) is not None:
        out.append(ALLOCATED_UNUSED)
    if outsiders(snap, g):
        out.append(OUTSIDE_SLURM)
    return tuple(out)


def time_left(job: JobAlloc, now: float) -> str:
    return "no limit" if job.end is None else f"{durations.format(job.end - now, 'people')} left"


def notes(snap: NodeSnapshot) -> tuple[str, ...]:
    """Return what Slurm says of the node, for its notes: its jobs on GPUs, a drain, a failure."""
    view = snap.slurm
    if view is None:
        return ()
    said = () if view.note is None else (one_line(f"Slurm {view.note}"),)
    if view.error is not None:
        return (*said, f"Slurm not read: {view.error}")
    out = list(said)
    if view.node is None:
        return (*said, "Slurm does not know this node")
    if view.node.drained:
        out.append(drained_text(view, snap.taken_at))
    by_index = {g.minor: g.index for g in snap.gpus if g.minor is not None}
    unproven = view.gres is not None and not view.gres.proven
    for job in view.jobs:
        minors = [view.gres.minor(i) for i in job.gpu_idx] if view.gres is not None else []
        gpus = sorted(by_index[m] for m in minors if m in by_index)
        if job.gpu_unknown:
            where = "its GPUs here not said by Slurm"
        else:
            where = "GPU " + ", ".join(map(str, gpus)) if gpus else "no GPU here"
        guess = " (by device order: gres.conf does not prove the map)" if unproven else ""
        out.append(
            one_line(
                f"Slurm job {job.job_id} ({job.user}, {job.name}): {where}{guess}, "
                f"{time_left(job, snap.taken_at)}"
            )
        )
    return tuple(out)


def drained_text(view: SlurmView, now: float) -> str:
    node = view.node
    assert node is not None
    state = "+".join(node.states).lower()
    since = (
        ""
        if node.reason_at is None
        else f" for {durations.format(max(0.0, now - node.reason_at), 'people')}"
    )
    who = f" by {node.reason_by}" if node.reason_by else ""
    why = f": {node.reason}" if node.reason else ""
    return one_line(f"Slurm holds the node {state}{since}{who}{why}")


def gpu_dict(snap: NodeSnapshot, g: GpuInfo) -> dict[str, object] | None:
    """Return a GPU's allocation for ``--json``: None on a node without a scheduler."""
    if snap.slurm is None:
        return None
    job = gpu_job(snap, g)
    sure = proven(snap.slurm)
    if job is None:
        return {"job": None, "map_proven": sure}
    # None: not known (an unproven map, a job not running): never "used" for want of proof
    used = (unused(snap, g) is None) if sure and job.state == "RUNNING" else None
    return {
        "job": job.job_id,
        "user": job.user,
        "name": job.name,
        "state": job.state,
        "end": job.end,
        "used": used,
        "map_proven": sure,
    }


def undeclared(snap: NodeSnapshot, scheduler: str | None) -> str | None:
    """Say so where a node's processes run in Slurm jobs (their cgroups) while the settings
    name no scheduler for it: Slurm is then detected, never assumed (None: nothing to say)."""
    jobs = sorted({j for p in snap.processes if (j := job_of(p.workload)) is not None})
    if scheduler is not None or not jobs:
        return None
    shown = ", ".join(jobs[:3]) + (" …" if len(jobs) > 3 else "")
    return (
        f"processes here run in Slurm jobs ({shown}) but the settings name no scheduler for "
        f'{snap.node}: add scheduler = "slurm" to see allocations beside use, refuse claims '
        "of allocated GPUs and drain through Slurm"
    )
