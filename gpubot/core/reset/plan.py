"""Planning a reset: a pure function of a snapshot and a request.

The plan names every process that will be signalled and why, and nothing else: never a holder of
only ``nvidiactl``/``nvidia-uvm``, never one on a GPU outside the request, never a protected daemon.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.reset.protect import Protection, is_protected, program
from gpubot.core.workload import Workload, describe, named, workload_from_dict
from gpubot.errors import ResetRefused, UsageError


@dataclass(frozen=True)
class ResetRequest:
    """What a person asked to free."""

    node: str
    # the Linux user the requester maps to; None: unknown, so every kill is forced
    requester: str | None
    gpus: tuple[int, ...] = ()  # empty: every GPU of the node (or the GPUs the given pids hold)
    pids: tuple[int, ...] = ()
    user: str | None = None  # only this Linux user's processes
    grace_s: float | None = None
    # Self-service floor: a process whose uid is below it (or root) is never the requester's
    # own, so killing it is forced. None: no floor (the CLI, run on the trusted gpubot host).
    min_uid: int | None = None


@dataclass(frozen=True)
class Target:
    """One process the reset will signal."""

    pid: int
    start_ticks: int | None  # None: /proc did not know it at planning time (nothing to signal)
    user: str | None
    gpus: tuple[int, ...]  # the requested GPUs it is on
    mib: int | None
    command: str
    reasons: tuple[str, ...]
    also_on: tuple[int, ...] = ()  # GPUs outside the request it also holds: they lose it too
    forced: bool = False
    state: str | None = None
    ppid: int | None = None
    uid: int | None = None  # the effective uid at planning: re-checked with every signal
    owner: str | None = None  # whose job it is: its workload's owner, else ``user``
    workload: Workload | None = None


@dataclass(frozen=True)
class Skipped:
    """A process on a requested GPU that the reset leaves alone, and why."""

    pid: int
    gpu: int
    user: str | None
    command: str
    reason: str
    start_ticks: int | None = None
    protected: bool = False  # a system daemon: the GPU is not free while it holds memory
    mib: int | None = None


@dataclass(frozen=True)
class ResetPlan:
    """The whole plan: targets, what is left alone, and what each GPU should fall to."""

    node: str
    gpus: tuple[int, ...]
    targets: tuple[Target, ...]
    skipped: tuple[Skipped, ...]
    requester: str | None
    memory_before_mib: dict[int, int | None] = field(default_factory=dict)
    # memory still expected on each GPU once the targets are gone (processes left alone)
    expected_after_mib: dict[int, int] = field(default_factory=dict)
    # why the requester asked (``… because``, ``--because``): shown and audited, never planned on
    reason: str | None = None

    @property
    def forced(self) -> bool:
        """Whether any target belongs to someone other than the requester."""
        return any(t.forced for t in self.targets)

    @property
    def owners(self) -> tuple[str, ...]:
        """Owners of the targets (a container's or job's owner, else the process's), sorted."""
        return tuple(sorted({t.owner or t.user or "?" for t in self.targets}))

    @property
    def workloads(self) -> tuple[str, ...]:
        """What the targets' workloads are, in words, each once, in target order."""
        said = [
            describe(t.workload)
            for t in self.targets
            if t.workload is not None and named(t.workload)
        ]
        return tuple(dict.fromkeys(said))

    @property
    def total_mib(self) -> int:
        """Memory the targets hold, where known (``unknown_mib``: how many are not known)."""
        return sum(t.mib or 0 for t in self.targets)

    @property
    def unknown_mib(self) -> int:
        """How many targets hold memory nobody could read (never counted as 0 MiB)."""
        return sum(1 for t in self.targets if t.mib is None)

    def identities(self) -> set[tuple[int, int | None]]:
        """Return (pid, start_ticks) of every process the plan saw on its GPUs."""
        return {(t.pid, t.start_ticks) for t in self.targets} | {
            (s.pid, s.start_ticks) for s in self.skipped
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["forced"] = self.forced
        d["memory_before_mib"] = {str(k): v for k, v in self.memory_before_mib.items()}
        d["expected_after_mib"] = {str(k): v for k, v in self.expected_after_mib.items()}
        if self.reason is None:  # a plan without one keeps the older shape
            del d["reason"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResetPlan:
        return cls(
            node=d["node"],
            gpus=tuple(d["gpus"]),
            targets=tuple(
                Target(
                    **{
                        **t,
                        "gpus": tuple(t["gpus"]),
                        "reasons": tuple(t["reasons"]),
                        "also_on": tuple(t["also_on"]),
                        "workload": workload_from_dict(t.get("workload")),
                    }
                )
                for t in d["targets"]
            ),
            skipped=tuple(Skipped(**s) for s in d["skipped"]),
            requester=d["requester"],
            memory_before_mib={int(k): v for k, v in d["memory_before_mib"].items()},
            expected_after_mib={int(k): v for k, v in d["expected_after_mib"].items()},
            reason=d["reason"] if isinstance(d.get("reason"), str) else None,
        )


def plan_reset(snapshot: NodeSnapshot, request: ResetRequest, protection: Protection) -> ResetPlan:
    """Plan which processes a reset signals; ``ResetRefused`` if it names a protected pid."""
    _check_named(snapshot, request, protection)
    gpus = _targeted_gpus(snapshot, request)
    chosen, skipped = _choose(snapshot, gpus, request, protection)
    targets = [_target(snapshot, procs, gpus, request) for procs in chosen.values()]
    targets.sort(key=lambda t: (t.gpus, t.pid))
    before: dict[int, int | None] = {}
    expected: dict[int, int] = {}
    for g in gpus:
        info = snapshot.gpu(g)
        before[g] = info.memory_used_mib if info else None
        left = [p for p in snapshot.on_gpu(g) if p.pid not in chosen]
        expected[g] = sum(p.used_memory_mib or 0 for p in left)
    return ResetPlan(
        node=snapshot.node,
        gpus=gpus,
        targets=tuple(targets),
        skipped=tuple(sorted(skipped, key=lambda s: (s.gpu, s.pid))),
        requester=request.requester,
        memory_before_mib=before,
        expected_after_mib=expected,
    )


def _check_named(snapshot: NodeSnapshot, request: ResetRequest, protection: Protection) -> None:
    """Refuse GPUs the node lacks, pids that hold no GPU, and protected pids."""
    indices = {g.index for g in snapshot.gpus}
    for g in request.gpus:
        if g not in indices:
            have = ", ".join(str(i) for i in sorted(indices)) or "none"
            raise UsageError(f"{snapshot.node} has no GPU {g} (GPUs: {have})")
    for pid in request.pids:
        if not any(p.pid == pid for p in snapshot.processes):
            raise UsageError(f"pid {pid} holds no GPU on {snapshot.node}")
        daemon = next(
            (p for p in snapshot.processes if p.pid == pid and is_protected(p, protection)), None
        )
        if daemon is not None:
            raise ResetRefused(
                f"pid {pid} on {snapshot.node} is a protected system daemon "
                f"({program(daemon)}, run by {daemon.user}): gpubot never signals it"
            )


def _targeted_gpus(snapshot: NodeSnapshot, request: ResetRequest) -> tuple[int, ...]:
    """Return the GPUs a reset targets; refuse a whole GPU whose holders cannot be seen, and
    pids outside the GPUs named."""
    if request.gpus:
        gpus = tuple(sorted(set(request.gpus)))
    elif request.pids:
        gpus = tuple(sorted({p.gpu_index for p in snapshot.processes if p.pid in request.pids}))
    else:
        gpus = tuple(sorted({g.index for g in snapshot.gpus}))
    if not request.pids:  # a whole GPU: its device file's holders must be knowable
        for g in gpus:
            info = snapshot.gpu(g)
            if info is not None and info.minor is None:
                raise ResetRefused(
                    f"{snapshot.node}: gpubot cannot tell which device file is GPU {g} (the driver "
                    "names no Device Minor for its bus id), so it cannot see who holds it; "
                    "reset by pid instead"
                )
    if request.pids:
        outside = [
            pid
            for pid in request.pids
            if not any(p.pid == pid and p.gpu_index in gpus for p in snapshot.processes)
        ]
        if outside:
            raise UsageError(f"pid {outside[0]} is not on GPU {', '.join(map(str, gpus))}")
    return gpus


def _choose(
    snapshot: NodeSnapshot, gpus: tuple[int, ...], request: ResetRequest, protection: Protection
) -> tuple[dict[int, list[GpuProcess]], list[Skipped]]:
    """Sort the processes on ``gpus`` into targets (by pid) and those left alone, with why."""
    chosen: dict[int, list[GpuProcess]] = {}
    skipped: list[Skipped] = []
    for proc in snapshot.processes:
        if proc.gpu_index not in gpus:
            continue
        protected = is_protected(proc, protection)
        reason = "protected system daemon" if protected else _skip_reason(proc, request)
        if reason:
            skipped.append(
                Skipped(
                    proc.pid,
                    proc.gpu_index,
                    proc.user,
                    _command(proc),
                    reason,
                    proc.start_ticks,
                    protected,
                    proc.used_memory_mib,
                )
            )
        else:
            chosen.setdefault(proc.pid, []).append(proc)
    return chosen, skipped


def owner_of(proc: GpuProcess) -> tuple[str | None, bool]:
    """Return whose job ``proc`` is and whether its workload (what root controls) said so."""
    w = proc.workload
    if w is not None and w.owner is not None:
        return w.owner, True
    return proc.user, False


def below_floor(uid: int | None, min_uid: int | None) -> bool:
    """Whether a process of ``uid`` is below the self-service floor (root always is)."""
    if min_uid is None:
        return False
    return uid is None or uid == 0 or uid < min_uid


def _command(proc: GpuProcess) -> str:
    return proc.command or proc.process_name


def _skip_reason(proc: GpuProcess, request: ResetRequest) -> str | None:
    if request.pids and proc.pid not in request.pids:
        return "not among the requested pids"
    if request.user and owner_of(proc)[0] != request.user:
        return f"not owned by {request.user}"
    if not proc.exists:
        return "no longer in /proc (nothing to signal)"
    if proc.uid is None:
        return "owner unknown (nothing to check a signal against)"
    return None


def _target(
    snapshot: NodeSnapshot, procs: list[GpuProcess], gpus: tuple[int, ...], request: ResetRequest
) -> Target:
    first = procs[0]
    on = tuple(sorted({p.gpu_index for p in procs}))
    elsewhere = tuple(
        sorted({p.gpu_index for p in snapshot.processes if p.pid == first.pid} - set(gpus))
    )
    reasons: list[str] = []
    if first.workload is not None and named(first.workload):
        reasons.append(f"kills {describe(first.workload)}")
    mib_known = [p.used_memory_mib for p in procs if p.used_memory_mib is not None]
    if any(p.visible_to_nvidia_smi for p in procs):
        reasons.append(f"holds {sum(mib_known)} MiB on GPU {', '.join(map(str, on))}")
    if any(p.hidden for p in procs):
        reasons.append(
            f"holds {', '.join(f'GPU {g}' for g in on)} device file but nvidia-smi does not list it"
        )
    if request.pids:
        reasons.append("pid requested")
    if elsewhere:
        reasons.append(f"also holds GPU {', '.join(map(str, elsewhere))}")
    owner, by_workload = owner_of(first)
    if by_workload:  # a container's process runs as root by design: its owner decides
        below = owner == "root" and request.min_uid is not None
    else:
        below = below_floor(first.uid, request.min_uid)
        if below and owner == request.requester:
            reasons.append(
                f"uid {first.uid} is below min_uid {request.min_uid}: never self-service"
            )
    forced = request.requester is None or owner != request.requester or below
    return Target(
        pid=first.pid,
        start_ticks=first.start_ticks,
        user=first.user,
        gpus=on,
        mib=sum(mib_known) if mib_known else None,
        command=_command(first),
        reasons=tuple(reasons),
        also_on=elsewhere,
        forced=forced,
        state=first.state,
        ppid=first.ppid,
        uid=first.uid,
        owner=owner,
        workload=first.workload,
    )
