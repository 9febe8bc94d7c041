"""Verification of a reset: poll ``nvidia-smi`` until each targeted GPU is decided.

A GPU is called freed only when its memory is back where the plan expects, no planned process
holds it and nobody new took it; one a restart policy may fill again must stay free for
``[reset] respawn_watch_s`` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubot.core.models import GpuProcess, NodeSnapshot, Outcome, ResetStep
from gpubot.core.probe.snapshot import parse_procs, proc_argv
from gpubot.core.reset.outcome import GpuObservation, GpuResult, Kept, Newcomer, Survivor, classify
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.workload import may_restart, short_name
from gpubot.errors import GpubotError
from gpubot.services.run_state import Pairs, RunState
from gpubot.services.workloads import as_planned


@dataclass
class _Progress:
    """What verification keeps between polls."""

    plan: ResetPlan
    pairs: Pairs
    deaths: dict[int, float]  # pid -> monotonic time it was seen gone
    start: float
    known: set[tuple[int, int | None]] = field(init=False)
    restartable: set[int] = field(init=False)  # GPUs a restart policy may fill again
    decided: dict[int, GpuResult] = field(default_factory=dict)
    free_since: dict[int, float] = field(default_factory=dict)
    killed_again: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.known = self.plan.identities()
        self.restartable = {g for t in self.plan.targets if may_restart(t.workload) for g in t.gpus}

    def pending(self) -> list[int]:
        return [g for g in self.plan.gpus if g not in self.decided]


async def verify(
    run: RunState,
    plan: ResetPlan,
    pairs: Pairs,
    deaths: dict[int, float],
    survivors: dict[int, Survivor],
) -> tuple[GpuResult, ...]:
    await run.emit(ResetStep.VERIFYING, gpus=list(plan.gpus))
    clock = run.clock
    progress = _Progress(plan, pairs, deaths, clock.monotonic())
    deadline = progress.start + run.cfg.verify_timeout_s
    for g in sorted({g for t in plan.targets if t.pid in survivors for g in t.gpus}):
        stuck = tuple(s for s in survivors.values() if _on(plan, s.pid, g))
        progress.decided[g] = await conclude(run, plan, GpuObservation(g, None, False, stuck), None)
    while pending := progress.pending():
        snap, last_error = await _poll(run, pending)
        now = clock.monotonic()
        if snap is not None:
            for g in pending:
                await _step(run, progress, snap, g, now)
        if clock.monotonic() >= deadline:
            await _give_up(run, progress, snap, last_error)
            break
        await clock.sleep(run.cfg.poll_interval_s)
    return tuple(progress.decided[g] for g in plan.gpus)


async def _poll(run: RunState, pending: list[int]) -> tuple[NodeSnapshot | None, str | None]:
    try:
        snap = await run.snapshot(gpu_indices=pending, names=False)
    except GpubotError as exc:
        return None, str(exc)
    run.last_snapshot = snap
    return snap, None


async def _step(run: RunState, p: _Progress, snap: NodeSnapshot, g: int, now: float) -> None:
    """Look at GPU ``g`` in one poll: kill planned holders again, decide it once it is clear."""
    obs = await observe(run, p, snap, g)
    back = [q.pid for q in snap.on_gpu(g) if _planned(q, p.pairs)]
    again = [pid for pid in back if pid not in p.killed_again]
    if again:  # a planned process still holds the device file: deal with it by PID
        p.killed_again.update(again)
        await run.send("KILL", {pid: p.pairs[pid] for pid in again}, p.deaths)
    if obs.verified and not obs.newcomers and g in p.restartable:
        p.free_since.setdefault(g, now)
        if now - p.free_since[g] < run.cfg.respawn_watch_s:
            return  # free, but not yet for long enough to be sure
    elif not obs.verified:
        p.free_since.pop(g, None)
    if obs.verified or obs.newcomers:
        seconds = _since(p.plan, g, p.deaths, p.start, p.free_since.get(g, now))
        p.decided[g] = await conclude(run, p.plan, obs, seconds)


async def _give_up(
    run: RunState, p: _Progress, snap: NodeSnapshot | None, last_error: str | None
) -> None:
    for g in p.pending():
        if snap is None:
            obs = GpuObservation(g, None, False, error=last_error)
        else:
            obs = await observe(run, p, snap, g)
        p.decided[g] = await conclude(run, p.plan, obs, None)


async def observe(run: RunState, prog: _Progress, snap: NodeSnapshot, g: int) -> GpuObservation:
    plan, pairs = prog.plan, prog.pairs
    gpu = snap.gpu(g)
    mem = gpu.memory_used_mib if gpu else None
    procs = [p for p in snap.on_gpu(g) if p.exists]
    planned_left = [p for p in procs if _planned(p, pairs)]
    newcomers = tuple(
        [await newcomer(run, plan, p) for p in procs if (p.pid, p.start_ticks) not in prog.known]
    )
    kept = tuple(
        Kept(p.pid, p.user, p.command or p.process_name, p.used_memory_mib)
        for p in procs
        if _protected(plan, p) and (p.used_memory_mib or 0) > 0
    ) + tuple(
        Kept(p.pid, p.user, p.process_name, p.used_memory_mib, protected=False)
        for p in snap.on_gpu(g)  # left alone as not in /proc, yet nvidia-smi gives it memory
        if not p.exists
        and p.visible_to_nvidia_smi
        and (p.used_memory_mib or 0) > 0
        and _left_alone(plan, p)
    )
    refused = tuple(
        f"pid {p.pid}: {run.refused[p.pid]}" for p in planned_left if p.pid in run.refused
    )
    limit = plan.expected_after_mib.get(g, 0) + run.cfg.free_threshold_mib
    verified = mem is not None and mem <= limit and not planned_left and not newcomers
    holders = len([p for p in procs if not _left_alone(plan, p)])
    blind = None
    if gpu is not None and gpu.minor is None:  # who holds its device file cannot be seen
        holders, blind = max(holders, 1), "its device file's holders cannot be seen"
    return GpuObservation(
        g,
        mem,
        verified,
        newcomers=newcomers,
        holders=holders,
        kept=kept,
        not_signalled=refused,
        error=blind,
    )


async def newcomer(run: RunState, plan: ResetPlan, p: GpuProcess) -> Newcomer:
    info = None
    if p.ppid:
        res = await run.remote(proc_argv([p.ppid]))
        info = parse_procs(res.stdout, [p.ppid]).get(p.ppid)
    cmd = p.command or p.process_name
    parent_cmd = info.command if info else None
    parent_w = info.workload if info else None
    either = parent_w or p.workload
    unit = short_name(either) if either is not None else None
    return Newcomer(
        p.pid,
        p.user,
        cmd,
        p.ppid,
        parent_cmd,
        unit,
        workload=as_planned(plan, p.workload or parent_w),
    )


async def conclude(
    run: RunState, plan: ResetPlan, obs: GpuObservation, seconds: float | None
) -> GpuResult:
    outcome, detail = classify(
        obs, plan.expected_after_mib.get(obs.index, 0), run.cfg.free_threshold_mib
    )
    res = GpuResult(
        obs.index,
        outcome,
        detail,
        plan.memory_before_mib.get(obs.index),
        obs.memory_after_mib,
        seconds if outcome is Outcome.FREED else None,
    )
    if outcome is Outcome.RESPAWNED and obs.newcomers[0].workload is not None:
        run.respawned[obs.index] = obs.newcomers[0].workload
    await run.emit(ResetStep.GPU_OUTCOME, **res.to_dict())
    return res


def _planned(p: GpuProcess, pairs: Pairs) -> bool:
    return p.pid in pairs and pairs[p.pid][0] == p.start_ticks


def _left_alone(plan: ResetPlan, p: GpuProcess) -> bool:
    return any(s.pid == p.pid and s.gpu == p.gpu_index for s in plan.skipped)


def _protected(plan: ResetPlan, p: GpuProcess) -> bool:
    """Whether ``p`` is a daemon the plan left alone as protected (same pid and start time)."""
    return any(
        s.protected and s.pid == p.pid and s.start_ticks == p.start_ticks and s.gpu == p.gpu_index
        for s in plan.skipped
    )


def _on(plan: ResetPlan, pid: int, g: int) -> bool:
    return any(t.pid == pid and g in t.gpus for t in plan.targets)


def _since(plan: ResetPlan, g: int, deaths: dict[int, float], start: float, now: float) -> float:
    """Seconds from the last target on GPU ``g`` dying to now (or from verification start)."""
    times = [deaths[t.pid] for t in plan.targets if g in t.gpus and t.pid in deaths]
    return round(now - (max(times) if times else start), 3)
