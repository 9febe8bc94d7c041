"""What a claim must not take: another user's running job, a GPU Slurm allocated (or any GPU
of a Slurm node, unless ``[slurm] claims``), and GPUs the node does not have; and who intrudes
on a claim now."""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.core.claims import commands as cc
from gpubot.core.claims.ports import ClaimStore
from gpubot.core.claims.rules import Intruder, intruders
from gpubot.core.health.kinds import parse_key
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.slurm import SLURM, SlurmSettings, alloc
from gpubot.errors import UsageError
from gpubot.services.status import StatusService


def refuse_scheduled(
    snap: NodeSnapshot, node: NodeConfig, cmd: cc.ClaimGpus, slurm: SlurmSettings
) -> None:
    """Refuse a claim of a GPU Slurm allocated (naming the job), and any claim on a node Slurm
    owns unless ``[slurm] claims`` lets claims in beside it: there, Slurm is who to ask."""
    if node.scheduler != SLURM:
        return
    name = node.slurm_name
    for g in snap.gpus:
        job = alloc.gpu_job(snap, g) if g.index in cmd.gpus else None
        if job is not None:
            raise UsageError(
                f"{node.name} GPU {g.index} is allocated by Slurm to job {job.job_id} "
                f"({job.user}, {alloc.time_left(job, snap.taken_at)}): ask Slurm for a GPU "
                f"(`salloc -w {name} --gres=gpu:1`)"
            )
    if not slurm.claims:
        n = len(cmd.gpus) or cmd.count
        raise UsageError(
            f"{node.name} is scheduled by Slurm: ask it for GPUs instead "
            f"(`salloc -w {name} --gres=gpu:{n}`, or `sbatch -w {name} --gres=gpu:{n} job.sh`)"
        )
    why = alloc.unsure(snap)
    if why is not None:  # fail closed: an allocated GPU would look free
        raise UsageError(f"{node.name}: what Slurm allocated cannot be told just now ({why})")


def refuse_others(snap: NodeSnapshot, gpus: Sequence[int], user: str, node: str) -> None:
    """Refuse to claim a GPU another user's job runs on: its *Free it* would be a forced kill
    of work that was there first."""
    for g in gpus:
        others = [p for p in snap.on_gpu(g) if not p.system and p.user not in (None, user)]
        if others:
            p = others[0]
            raise UsageError(
                f"{node} GPU {g} runs {p.user}'s job (pid {p.pid}): "
                f"`/gpu wait {node} gpu {g}` queues you"
            )


def uuids_of(snap: NodeSnapshot, gpus: Sequence[int]) -> tuple[tuple[int, str], ...]:
    out = []
    for g in gpus:
        info = snap.gpu(g)
        if info is None:
            have = ", ".join(str(x.index) for x in snap.gpus) or "none"
            raise UsageError(f"{snap.node} has no GPU {g} (it has {have})")
        out.append((g, info.uuid))
    return tuple(out)


async def intruder_now(
    status: StatusService, store: ClaimStore, key: str, claimant: str
) -> Intruder | None:
    """Look for the intruder of the finding ``key`` on its node now (None: not there), for the
    ``claimant`` of its GPU alone: nobody else makes gpubot probe a node by asking."""
    k = parse_key(key)
    active = await store.active(k.node)
    if not any(c.gpu == k.gpu and c.chat_id == claimant for c in active):
        where = f"{k.node} GPU {k.gpu}"
        raise UsageError(f"you hold no claim of {where}: only its claimant may ask to free it")
    snap = await status.snapshot(status.node(k.node))
    found = intruders(snap, active)
    return next((i for i in found if i.finding().key.text() == key), None)
