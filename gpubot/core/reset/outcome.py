"""Classifying how each targeted GPU ended: never call a GPU freed that is not."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpubot.core.models import Outcome
from gpubot.core.workload import Workload, describe, stop_command


@dataclass(frozen=True)
class Survivor:
    """A target still alive after SIGKILL."""

    pid: int
    state: str | None
    wchan: str | None


@dataclass(frozen=True)
class Newcomer:
    """A process on a targeted GPU that was not there when the plan was made."""

    pid: int
    user: str | None
    command: str
    ppid: int | None
    parent_command: str | None
    parent_unit: str | None  # the parent's workload (unit, container, job), short form
    workload: Workload | None = None  # the workload it runs in (named as in the plan if known)


@dataclass(frozen=True)
class Kept:
    """A process the reset could not touch that still holds memory: a protected daemon, or
    one ``/proc`` does not show (hidepid, or gone while the driver keeps its memory)."""

    pid: int
    user: str | None
    command: str
    mib: int | None
    protected: bool = True


@dataclass(frozen=True)
class GpuObservation:
    """What verification saw of one targeted GPU at its end."""

    index: int
    memory_after_mib: int | None
    verified: bool  # memory reached the expected level with no target or newcomer on it
    survivors: tuple[Survivor, ...] = ()
    newcomers: tuple[Newcomer, ...] = ()
    holders: int = 0  # processes still on the GPU (listed or holding its device file)
    error: str | None = None  # the last verification failure, if verification never succeeded
    kept: tuple[Kept, ...] = ()  # protected daemons still holding memory there
    not_signalled: tuple[str, ...] = ()  # planned processes the node's identity check refused


@dataclass(frozen=True)
class GpuResult:
    """The outcome of one targeted GPU."""

    index: int
    outcome: Outcome
    detail: str
    memory_before_mib: int | None
    memory_after_mib: int | None
    seconds_to_free: float | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = str(self.outcome)
        return d


ALREADY_FREE = "already free"


def already_free(result: GpuResult, signalled: bool) -> bool:
    """Whether a GPU ended freed with nothing to free: "freed (0 → 0 MiB)" read as work done.
    The outcome stays ``freed``; only its words change."""
    before, after = result.memory_before_mib, result.memory_after_mib
    return (
        result.outcome is Outcome.FREED
        and not signalled
        and before is not None
        and after is not None
        and after >= before
    )


def outcome_words(result: GpuResult, signalled: bool) -> str:
    return ALREADY_FREE if already_free(result, signalled) else str(result.outcome)


def classify(
    obs: GpuObservation, expected_after_mib: int, threshold_mib: int
) -> tuple[Outcome, str]:
    """Decide the outcome of one GPU and say why, with the next step for a person."""
    if obs.survivors:
        s = obs.survivors[0]
        where = f" in state {s.state}" if s.state else ""
        wchan = f", waiting in {s.wchan}" if s.wchan else ""
        return Outcome.STUCK, (
            f"pid {s.pid} survived SIGKILL{where}{wchan}: it is stuck in the kernel; "
            "a node reboot is the usual fix"
        )
    if obs.newcomers:
        n = obs.newcomers[0]
        parent = f"parent pid {n.ppid}" if n.ppid else "unknown parent"
        if n.parent_command:
            parent += f" ({n.parent_command})"
        if n.workload is not None and (stop := stop_command(n.workload)) is not None:
            return Outcome.RESPAWNED, (
                f"pid {n.pid} ({n.command}) took the GPU again in {describe(n.workload)}, "
                f"which restarts it: stop it with `{stop}`"
            )
        unit = f", unit {n.parent_unit}" if n.parent_unit else ""
        return Outcome.RESPAWNED, (
            f"pid {n.pid} ({n.command}) took the GPU again, started by {parent}{unit}: "
            "stop the supervisor first"
        )
    if obs.kept:
        k = obs.kept[0]
        if not k.protected:
            return Outcome.STUCK, (
                f"pid {k.pid} still holds {k.mib} MiB by nvidia-smi, but /proc does not show it "
                "(hidden, or gone while the driver keeps its memory): gpubot cannot signal it"
            )
        return Outcome.STUCK, (
            f"pid {k.pid} ({k.command}, {k.user or '?'}) is a protected system daemon, left alone, "
            f"and still holds {k.mib} MiB: stop that service by hand if the GPU must be empty"
        )
    if obs.not_signalled and not obs.verified:
        return Outcome.UNKNOWN, f"not verified free: {obs.not_signalled[0]}"
    if obs.verified:
        return Outcome.FREED, f"memory at {obs.memory_after_mib} MiB"
    if obs.memory_after_mib is None:
        return Outcome.UNKNOWN, f"could not verify: {obs.error or 'no answer from nvidia-smi'}"
    limit = expected_after_mib + threshold_mib
    if obs.holders == 0 and obs.memory_after_mib > limit:
        return Outcome.ORPHANED, (
            f"{obs.memory_after_mib} MiB still in use and no process holds the GPU: "
            f"the memory leaked; a GPU reset (nvidia-smi --gpu-reset -i {obs.index}) frees it"
        )
    why = obs.error or f"memory still {obs.memory_after_mib} MiB (expected <= {limit})"
    return Outcome.UNKNOWN, f"not verified free: {why}"
