"""Claims and the queue as pure decisions: which GPUs are free, which to pick, who intrudes.

A claim is a person's word that they use a GPU until a time; it kills nothing by itself. The
store writes claims conditionally, so two people who claim one GPU at once get one winner.
Times are unix seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpubot.core import durations
from gpubot.core.findings import Finding, FindingKind, process_finding, workload_label
from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.slurm import alloc
from gpubot.core.usage.idle import GpuSample, holder_owner
from gpubot.core.usage.idle_runs import IdleRun, RunRule, advance, can_advance

CLAIM_INTRUDER = FindingKind("claim-intruder", "unclaimed use of a claimed GPU")


@dataclass(frozen=True)
class GroupLimit:
    """``[claims.groups.NAME]``: tighter limits on the nodes of one group."""

    group: str
    max_hours: float | None = None
    max_gpus_per_user: int | None = None


@dataclass(frozen=True)
class ClaimSettings:
    """``[claims]``: claims, limits, the queue's hold, idle claims and intruders."""

    enabled: bool = False
    max_hours: float = 24.0  # the longest a claim may run (extensions included)
    max_gpus_per_user: int = 8  # GPUs one person may hold at once, across the fleet
    hold_minutes: float = 15.0  # how long a free GPU is held for the first waiter
    claim_idle_minutes: float = 60.0  # a claimed GPU at 0 % this long: Keep / Release (0: off)
    intruder_grace_s: float = 0.0  # how long before an intruder's "Free it" button appears
    free_below_mib: int = 256  # "free": no process and memory in use below this
    every_s: float = 60.0  # how often claims expire and the queue is served
    groups: tuple[GroupLimit, ...] = ()

    def limits_for(self, groups: tuple[str, ...]) -> tuple[float, int]:
        """Return the tightest (max hours, max GPUs per user) on a node of ``groups``."""
        hours, gpus = self.max_hours, self.max_gpus_per_user
        for g in self.groups:
            if g.group in groups:
                hours = min(hours, g.max_hours if g.max_hours is not None else hours)
                gpus = min(gpus, g.max_gpus_per_user if g.max_gpus_per_user is not None else gpus)
        return hours, gpus


class ClaimState(StrEnum):
    """Life of a claim: active until released by its holder, or expired when its time ran out."""

    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"


class WaitState(StrEnum):
    """Life of a place in the queue."""

    WAITING = "waiting"  # in line
    OFFERED = "offered"  # told the GPUs are free; they are held until ``hold_until``
    TAKEN = "taken"  # claimed (or, without claims, told)
    LAPSED = "lapsed"  # the hold ran out: the next in line is offered
    LEFT = "left"  # the person left the queue


@dataclass(frozen=True)
class Claim:
    """One claimed GPU."""

    id: int
    node: str
    gpu: int
    gpu_uuid: str
    user: str  # the Linux user whose processes may use it
    chat_id: str  # who claimed it, as the front end names them (DMs go there)
    start: float
    end: float
    note: str
    state: ClaimState = ClaimState.ACTIVE
    ended_at: float | None = None  # when it was released or expired
    idle_since: float | None = None  # its GPU's idle run (``idle_step``): since when idle
    idle_last_at: float | None = None  # the run's latest look
    idle_dm_at: float | None = None  # when its holder was asked Keep / Release

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "gpu": self.gpu,
            "gpu_uuid": self.gpu_uuid,
            "user": self.user,
            "by": self.chat_id,
            "start": self.start,
            "end": self.end,
            "note": self.note,
            "state": self.state.value,
        }


@dataclass(frozen=True)
class Wait:
    """One person's place in the queue for GPUs of a node."""

    id: int
    node: str
    gpus: tuple[int, ...]  # these GPUs; () : any ``count`` of the node's
    count: int
    duration_s: float | None  # the claim they want once free (None: just tell me)
    user: str
    chat_id: str
    created: float
    state: WaitState = WaitState.WAITING
    offered: tuple[int, ...] = ()  # the GPUs held for them
    hold_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "gpus": list(self.gpus),
            "count": self.count,
            "duration_s": self.duration_s,
            "user": self.user,
            "by": self.chat_id,
            "since": self.created,
            "state": self.state.value,
            "held": list(self.offered),
            "hold_until": self.hold_until,
        }


def busy(snapshot: NodeSnapshot, gpu: int, below_mib: int) -> bool:
    """Whether ``gpu`` runs a job or holds ``below_mib`` or more; unknown memory is in use."""
    if any(not p.system for p in snapshot.on_gpu(gpu)):
        return True
    info = snapshot.gpu(gpu)
    return info is None or info.memory_used_mib is None or info.memory_used_mib >= below_mib


def free_gpus(snapshot: NodeSnapshot, claimed: Iterable[int], below_mib: int) -> tuple[int, ...]:
    """Return the unclaimed GPUs of ``snapshot`` that are not busy, have no flag and that no
    Slurm job was allocated (``core.slurm.alloc``: a job that has not started its work yet); on
    a Slurm node whose allocation cannot be told now, none."""
    taken = set(claimed)
    return tuple(
        g.index
        for g in snapshot.gpus
        if g.index not in taken
        and not g.flags
        and not busy(snapshot, g.index, below_mib)
        and alloc.gpu_job(snapshot, g) is None
        and alloc.unsure(snapshot) is None
    )


def pick(free: Sequence[int], count: int, used_last: Mapping[int, float]) -> tuple[int, ...]:
    """Choose ``count`` of ``free``: those the person used last first, then the lowest; ()
    when there are not enough."""
    if count > len(free):
        return ()
    order = sorted(free, key=lambda g: (-used_last.get(g, float("-inf")), g))
    return tuple(sorted(order[:count]))


NEAR_S = 5.0  # an intruder that started this close to the claim started "as it began"


@dataclass(frozen=True)
class Intruder:
    """A process of someone other than the claimant on a claimed GPU."""

    claim: Claim
    process: GpuProcess
    started: float | None  # unix time it started (None: unknown)

    def relative(self) -> str:
        """Say when it started relative to the claim: "before the claim" / "12m after"."""
        if self.started is None:
            return "at an unknown time"
        delta = self.started - self.claim.start
        if abs(delta) < NEAR_S:  # process ages are whole seconds: no side to tell
            return "as the claim began"
        word = "after" if delta >= 0 else "before"
        return f"{durations.format(abs(delta), 'minutes')} {word} the claim"

    def what(self) -> str:
        """Name the intruder's workload: "alice's docker:train (pid 42 python3)"."""
        p = self.process
        label = workload_label(p)
        inner = f"pid {p.pid} {p.process_name}"
        return f"{holder_owner(p)}'s " + (f"{label} ({inner})" if label else inner)

    def finding(self) -> Finding:
        p, c = self.process, self.claim
        mem = "" if p.used_memory_mib is None else f", {p.used_memory_mib} MiB"
        what = f"{self.what()} on GPU {c.gpu}, claimed by {c.user}; it started {self.relative()}"
        return process_finding(c.node, c.gpu, CLAIM_INTRUDER, p, what + mem)


def intruders(snapshot: NodeSnapshot, claims: Iterable[Claim]) -> list[Intruder]:
    """Return the processes on claimed GPUs that are not the claimant's; system daemons and
    unknown owners never are. The owner is ``holder_owner``'s (a rootless container's user
    slice), never the subordinate uid its process runs as."""
    out: list[Intruder] = []
    for c in claims:
        if c.node != snapshot.node or c.state is not ClaimState.ACTIVE:
            continue
        for p in snapshot.on_gpu(c.gpu):
            owner = holder_owner(p)
            if p.system or owner is None or owner == c.user:
                continue
            started = None if p.elapsed_s is None else snapshot.taken_at - p.elapsed_s
            out.append(Intruder(c, p, started))
    return out


def idle_rule(every_s: float) -> RunRule:
    """The claims' idle rule: 0 % utilisation whatever the memory; a gap of three looks ends a
    run, since nothing is known in between."""
    return RunRule.of(0, 3 * every_s)


def idle_step(claim: Claim, sample: GpuSample, rule: RunRule) -> tuple[float | None, float]:
    """Fold one look into a claim's idle run: return (idle since, last look)."""
    run = None
    if claim.idle_last_at is not None:
        run = IdleRun(
            claim.node, claim.gpu, claim.gpu_uuid, claim.idle_last_at, claim.idle_since, rule
        )
    if run is not None and not can_advance(run, sample, rule):
        return claim.idle_since, claim.idle_last_at or sample.taken_at
    new = advance(run, sample, rule)
    return new.idle_since, new.last_at


def cuda_visible(uuids: Sequence[str]) -> str:
    """Return the environment line for ``uuids``: CUDA's order is not nvidia-smi's PCI order,
    so indices would name other GPUs; UUIDs name these."""
    return "CUDA_VISIBLE_DEVICES=" + ",".join(uuids)


@dataclass(frozen=True)
class Limit:
    """At most ``most`` GPUs claimed by one person on ``nodes`` (None: the whole fleet)."""

    most: int
    nodes: tuple[str, ...] | None = None
    group: str | None = None  # the group that sets it, to say so


@dataclass(frozen=True)
class ClaimRequest:
    """One claim of GPUs of one node."""

    node: str
    gpus: tuple[tuple[int, str], ...]  # (index, uuid)
    user: str
    chat_id: str
    start: float
    end: float
    note: str
    source: str
    limits: tuple[Limit, ...] = ()
    wait_id: int | None = None  # claiming the hold of this place in the queue


@dataclass(frozen=True)
class Granted:
    """The claim was written."""

    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class Conflict:
    """Refused: these GPUs are claimed by others, or held by the queue for others."""

    held: tuple[Claim, ...]
    holds: tuple[Wait, ...] = ()


@dataclass(frozen=True)
class OverLimit:
    """Refused: the claim would pass a limit."""

    limit: Limit
    have: int
    asked: int

    def text(self) -> str:
        """Say which limit, in one line."""
        where = "" if self.limit.group is None else f" on the nodes of group {self.limit.group}"
        return (
            f"that would make {self.have + self.asked} claimed GPUs{where}; "
            f"the limit is {self.limit.most} per person (you hold {self.have})"
        )


ClaimOutcome = Granted | Conflict | OverLimit
