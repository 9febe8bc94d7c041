"""The sweep's findings on a node Slurm owns (issue 36): a GPU a job was allocated and does not
use, a process on a GPU that no job of it runs, a node Slurm holds drained or down.

Pure. Evidence that names a person is that person's own: an unused allocation names the job's
user and counts only from when this job was first seen not using that GPU (never before the
job started); an outsider names the process's own user, keyed by its pid and start ticks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpubot.core import durations
from gpubot.core.findings import Finding, FindingKind, process_finding
from gpubot.core.models import NodeSnapshot
from gpubot.core.slurm import alloc

ALLOCATED_UNUSED = FindingKind("slurm-allocated-unused", "GPU allocated by Slurm, unused")
OUTSIDE_SLURM = FindingKind("slurm-outside", "GPU used outside Slurm", reset=True)
NODE_DRAINED = FindingKind("slurm-node-drained", "node drained in Slurm")

UnusedKey = tuple[str, str, int]  # node, job id, GPU index


def unused_now(snaps: Iterable[NodeSnapshot]) -> dict[UnusedKey, float | None]:
    """Return every (node, job, GPU) allocated and unused in ``snaps``, with the job's start."""
    out: dict[UnusedKey, float | None] = {}
    for snap in snaps:
        for g in snap.gpus:
            job = alloc.unused(snap, g)
            if job is not None:
                out[(snap.node, job.job_id, g.index)] = job.start
    return out


def find_slurm(
    snaps: Iterable[NodeSnapshot],
    unused_since: Mapping[UnusedKey, float],
    window_s: float,
    at: float,
) -> list[Finding]:
    """Return the Slurm findings of one sweep. ``unused_since``: since when each (node, job,
    GPU) has been seen unused; one unused for ``window_s`` or longer is a finding."""
    out: list[Finding] = []
    for snap in snaps:
        view = snap.slurm
        if view is None or not alloc.readable(view):
            continue
        assert view.node is not None
        if view.node.drained:
            out.append(
                Finding(snap.node, None, NODE_DRAINED, "", alloc.drained_text(view, snap.taken_at))
            )
        for g in sorted(snap.gpus, key=lambda g: g.index):
            job = alloc.unused(snap, g)
            since = None if job is None else unused_since.get((snap.node, job.job_id, g.index))
            if job is not None and since is not None and at - since >= window_s:
                idle = durations.format(at - since, "people")
                out.append(
                    Finding(
                        snap.node,
                        g.index,
                        ALLOCATED_UNUSED,
                        f"job:{job.job_id}",
                        f"Slurm job {job.job_id} ({job.name}) of {job.user} was allocated "
                        f"GPU {g.index} and has not used it for {idle}",
                        user=job.user,
                        owner=job.user,
                        workload=f"slurm:{job.job_id}",
                        idle_s=at - since,
                        idle_since=since,
                    )
                )
            for p in alloc.outsiders(snap, g):
                job_id = alloc.job_id_of(p)
                how = "outside Slurm" if job_id is None else f"in job {job_id}, not allocated it"
                mem = "" if p.used_memory_mib is None else f", {p.used_memory_mib} MiB"
                said = f"pid {p.pid} {p.process_name} ({p.user or '?'}) uses GPU {g.index} {how}"
                out.append(
                    process_finding(snap.node, g.index, OUTSIDE_SLURM, p, said + mem, owner=p.user)
                )
    return out
