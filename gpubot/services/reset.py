"""The reset engine: plan → audit intent → SIGTERM → grace → SIGKILL → device holders → verify.

Only planned processes are ever signalled, each after an identity check on the node (pid, start
time and owner, in the same exec as the signal); no fixed
sleeps; a GPU is called freed only when ``nvidia-smi`` shows its memory back where expected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpubot.config import Settings
from gpubot.core.models import GpuProcess, NodeConfig, NodeSnapshot, Outcome
from gpubot.core.nvsmi import USABLE_EXIT
from gpubot.core.outcome import GpuObservation, GpuResult, Kept, Newcomer, Survivor, classify
from gpubot.core.plan import ResetPlan, ResetRequest, plan_reset
from gpubot.core.ports import AuditStore, Locks, ResetObserver, Transport
from gpubot.core.probe import parse_procs, proc_argv
from gpubot.core.signals import Identity, PidReport, parse_signal_output, signal_argv
from gpubot.core.workload import Workload, may_restart
from gpubot.errors import GpubotError, LockHeld, ResetRefused, UsageError
from gpubot.services.status import StatusService
from gpubot.services.workloads import as_planned, stop_respawned


@dataclass(frozen=True)
class ResetEvent:
    """One step of a reset, as it happens: planned, signal, exited, verifying, gpu_outcome, done."""

    kind: str
    at: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready form."""
        return {"kind": self.kind, "at": _iso(self.at), **self.data}


@dataclass(frozen=True)
class ResetResult:
    """Everything a reset did and how each GPU ended."""

    node: str
    plan: ResetPlan
    gpus: tuple[GpuResult, ...]
    steps: tuple[ResetEvent, ...]
    before: NodeSnapshot
    after: NodeSnapshot | None
    action_id: int | None

    @property
    def ok(self) -> bool:
        """Whether every targeted GPU ended freed."""
        return all(g.outcome is Outcome.FREED for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` document."""
        return {
            "node": self.node,
            "action_id": self.action_id,
            "plan": self.plan.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "gpus": [g.to_dict() for g in self.gpus],
            "ok": self.ok,
        }


EventSink = Callable[[ResetEvent], Awaitable[None]]


class NodeLocks:
    """In-process named locks (one process, no shared database): the default ``Locks``."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}

    @asynccontextmanager
    async def hold(self, name: str, *, holder: str = "") -> AsyncIterator[None]:
        """Hold ``name`` or raise ``LockHeld`` naming who holds it and since when."""
        if name in self._held:
            who, since = self._held[name]
            raise LockHeld(name, f"{who} since {_iso(since)}")
        self._held[name] = (holder, time.time())
        try:
            yield
        finally:
            del self._held[name]


def reset_lock(node: str) -> str:
    """Return the name of the lock a reset of ``node`` holds (shared by every replica)."""
    return f"reset:{node}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class ResetService:
    """Frees GPUs safely; the CLI, the console and Slack all call this one engine."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        store: AuditStore,
        status: StatusService,
        locks: Locks | None = None,
        observer: ResetObserver | None = None,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.store = store
        self.status = status
        self.locks: Locks = locks or NodeLocks()
        self.observer = observer

    async def _observed(self, work: Awaitable[ResetResult]) -> ResetResult:
        """Run a reset and count how each GPU ended (or that it was refused or failed)."""
        if self.observer is None:
            return await work
        try:
            result = await work
        except ResetRefused:
            self.observer.count_reset("refused")
            raise
        except Exception:
            self.observer.count_reset("error")
            raise
        for g in result.gpus:
            self.observer.count_reset(str(g.outcome))
        return result

    async def plan(self, request: ResetRequest) -> tuple[ResetPlan, NodeSnapshot]:
        """Snapshot the node and plan the reset (nothing is signalled)."""
        node = self.status.node(request.node)
        snap = await self.status.snapshot(node)
        return plan_reset(snap, request, self.settings.reset.protection), snap

    async def execute(
        self,
        plan: ResetPlan,
        *,
        actor: str,
        source: str,
        command: str,
        on_event: EventSink | None = None,
        approval_id: int | None = None,
        grace_s: float | None = None,
        before: NodeSnapshot | None = None,
        approval: Mapping[str, Any] | None = None,
    ) -> ResetResult:
        """Run a planned reset; the intent is audited before any signal (fail closed).

        ``approval``: who asked for a forced kill and who approved it, recorded with the intent.
        """
        node = self.status.node(plan.node)
        grace = self.settings.reset.grace_s if grace_s is None else grace_s

        async def body(run: _Run) -> tuple[tuple[GpuResult, ...], NodeSnapshot]:
            snap = before if before is not None else await self.status.snapshot(node)
            return await run.reset(plan, grace, snap), snap

        intent = {**plan.to_dict(), "approval_id": approval_id}
        if approval is not None:
            intent["approval"] = dict(approval)
        return await self._observed(self._audited(
            "reset", node, plan, intent, body, actor=actor, source=source, command=command,
            on_event=on_event,
        ))  # fmt: skip

    async def gpu_reset(
        self,
        node_name: str,
        gpu: int,
        *,
        actor: str,
        source: str,
        command: str,
        on_event: EventSink | None = None,
    ) -> ResetResult:
        """Run ``nvidia-smi --gpu-reset`` on an idle GPU and verify it like a reset."""
        return await self._observed(
            self._gpu_reset(node_name, gpu, actor=actor, source=source, command=command,
                            on_event=on_event)
        )  # fmt: skip

    async def _gpu_reset(
        self,
        node_name: str,
        gpu: int,
        *,
        actor: str,
        source: str,
        command: str,
        on_event: EventSink | None = None,
    ) -> ResetResult:
        node = self.status.node(node_name)
        before = await self.status.snapshot(node)
        if before.gpu(gpu) is None:
            raise UsageError(f"{node.name} has no GPU {gpu}")
        busy = [p for p in before.on_gpu(gpu) if p.exists and not p.system]
        if busy:
            who = ", ".join(f"{p.user or '?'}:{p.pid}" for p in busy)
            raise ResetRefused(
                f"GPU {gpu} on {node.name} still has processes ({who}): reset them first"
            )
        daemons = [p for p in before.on_gpu(gpu) if p.exists and p.system]
        if daemons and not self.settings.reset.toggle_persistence:
            names = ", ".join(f"{p.process_name} (pid {p.pid})" for p in daemons)
            raise ResetRefused(
                f"GPU {gpu} on {node.name} is held by {names}: with persistence mode on, "
                "nvidia-smi --gpu-reset fails with 'In use by another client'; set [reset] "
                "toggle_persistence = true to turn it off and on around the reset"
            )
        plan = plan_reset(
            before, ResetRequest(node.name, None, gpus=(gpu,)), self.settings.reset.protection
        )

        async def body(run: _Run) -> tuple[tuple[GpuResult, ...], NodeSnapshot]:
            return await run.gpu_reset(plan, gpu, toggle=bool(daemons)), before

        return await self._audited(
            "gpu-reset", node, plan, plan.to_dict(), body, actor=actor, source=source,
            command=command, on_event=on_event,
        )  # fmt: skip

    async def _audited(
        self,
        kind: str,
        node: NodeConfig,
        plan: ResetPlan,
        intent: dict[str, Any],
        body: Callable[[_Run], Awaitable[tuple[tuple[GpuResult, ...], NodeSnapshot]]],
        *,
        actor: str,
        source: str,
        command: str,
        on_event: EventSink | None,
    ) -> ResetResult:
        """Hold the node, write the intent, run ``body``, write the outcome (fail closed)."""
        async with self.locks.hold(reset_lock(node.name), holder=actor):
            action_id = await self.store.begin_action(
                kind=kind, actor=actor, source=source, command=command,
                node=node.name, gpus=plan.gpus, plan=intent,
            )  # fmt: skip
            run = _Run(self, node, action_id, on_event)
            try:
                gpus, before = await body(run)
                after = await run.final_snapshot()
            except BaseException as exc:
                await _finish_quietly(self.store, action_id, exc, run.steps)
                raise
            result = ResetResult(node.name, plan, gpus, tuple(run.steps), before, after, action_id)
            await self.store.finish_action(
                action_id, status="freed" if result.ok else "not-freed", result=result.to_dict()
            )
            return result


async def _finish_quietly(
    store: AuditStore, action_id: int, exc: BaseException, steps: Sequence[ResetEvent]
) -> None:
    """Record a failed action's end; if even that fails the action stays visibly incomplete."""
    with suppress(GpubotError):
        await store.finish_action(
            action_id,
            status="error",
            result={"error": str(exc) or type(exc).__name__, "steps": [s.to_dict() for s in steps]},
        )


class _Run:
    """State of one reset in progress: its steps, and how it talks to the node."""

    def __init__(
        self, svc: ResetService, node: NodeConfig, action_id: int, sink: EventSink | None
    ) -> None:
        self.svc = svc
        self.node = node
        self.action_id = action_id
        self.sink = sink
        self.cfg = svc.settings.reset
        self.steps: list[ResetEvent] = []
        self.last_snapshot: NodeSnapshot | None = None
        self.refused: dict[int, str] = {}  # planned pids the node's identity check refused, why
        self.respawned: dict[int, Workload] = {}  # GPU -> the workload that took it again

    async def emit(self, kind: str, **data: Any) -> None:
        """Record a step in the audit log first (a failure stops the reset), then report it."""
        event = ResetEvent(kind, time.time(), data)
        self.steps.append(event)
        await self.svc.store.record_event(self.action_id, event.to_dict())
        if self.sink is not None:
            await self.sink(event)

    async def signal(self, sig: str, ids: Sequence[Identity]) -> dict[int, PidReport]:
        """Signal (or check) planned processes, identity checked on the node."""
        if not ids:
            return {}
        argv = signal_argv(sig, ids, sudo=self.node.sudo)
        res = await self.svc.transport.run(
            self.node, argv, timeout=self.svc.settings.ssh.command_timeout_s
        )
        return parse_signal_output(res.stdout)

    async def reset(
        self, plan: ResetPlan, grace_s: float, before: NodeSnapshot | None = None
    ) -> tuple[GpuResult, ...]:
        """Signal the plan's targets and verify every targeted GPU; with ``[reset]
        stop_workloads``, stop what respawned them and verify again."""
        results = await self._reset(plan, grace_s)
        stop = self.cfg.stop_workloads and self.respawned and before is not None
        if stop and before is not None and await stop_respawned(self, plan, before):
            self.respawned = {}
            results = await self.verify(plan, {}, {}, {})
        return results

    async def _reset(self, plan: ResetPlan, grace_s: float) -> tuple[GpuResult, ...]:
        await self.emit(
            "planned", gpus=list(plan.gpus), targets=[t.pid for t in plan.targets],
            forced=plan.forced,
        )  # fmt: skip
        pairs: dict[int, tuple[int, int]] = {}
        for t in plan.targets:
            if t.start_ticks is None or t.uid is None:  # a plan from before owners were known
                self.refused[t.pid] = "the plan does not know its start time and owner"
                await self.emit("signal", pid=t.pid, signal="SIGTERM", result="not-sent",
                                why=self.refused[t.pid])  # fmt: skip
            else:
                pairs[t.pid] = (t.start_ticks, t.uid)
        deaths: dict[int, float] = {}
        alive = await self.send("TERM", pairs, deaths)
        alive = await self.wait_gone(alive, pairs, deaths, time.monotonic() + grace_s)
        last: dict[int, PidReport] = {}
        if alive:
            alive = await self.send("KILL", {p: pairs[p] for p in alive}, deaths)
            kill_wait = min(5.0, self.cfg.verify_timeout_s)
            alive = await self.wait_gone(alive, pairs, deaths, time.monotonic() + kill_wait)
            last = await self.signal("check", _ids(pairs, alive))
        survivors = {
            p: Survivor(p, r.state, r.wchan) for p, r in last.items() if r.status == "alive"
        }
        return await self.verify(plan, pairs, deaths, survivors)

    async def send(
        self, sig: str, pairs: dict[int, tuple[int, int]], deaths: dict[int, float]
    ) -> set[int]:
        """Send ``sig`` to each planned process; return the PIDs it reached."""
        reports = await self.signal(sig, _ids(pairs, pairs))
        reached: set[int] = set()
        for pid, rep in sorted(reports.items()):
            why = rep.why
            if why is None:
                await self.emit("signal", pid=pid, signal=f"SIG{sig}", result=rep.status)
            else:
                self.refused[pid] = why
                await self.emit("signal", pid=pid, signal=f"SIG{sig}", result=rep.status, why=why)
            if rep.status == "sent":
                reached.add(pid)
            elif rep.status == "gone":
                deaths.setdefault(pid, time.monotonic())
        return reached

    async def wait_gone(
        self,
        alive: set[int],
        pairs: dict[int, tuple[int, int]],
        deaths: dict[int, float],
        deadline: float,
    ) -> set[int]:
        """Poll until every PID in ``alive`` is gone or the deadline passes."""
        alive = set(alive)
        while alive and time.monotonic() < deadline:
            await asyncio.sleep(self.cfg.poll_interval_s)
            reports = await self.signal("check", _ids(pairs, alive))
            now = time.monotonic()
            for pid in sorted(alive):
                rep = reports.get(pid)
                if rep is None or rep.status != "alive":
                    alive.discard(pid)
                    deaths[pid] = now
                    await self.emit("exited", pid=pid)
        return alive

    async def verify(
        self,
        plan: ResetPlan,
        pairs: dict[int, tuple[int, int]],
        deaths: dict[int, float],
        survivors: dict[int, Survivor],
    ) -> tuple[GpuResult, ...]:
        """Poll nvidia-smi until each targeted GPU is decided or the deadline passes."""
        await self.emit("verifying", gpus=list(plan.gpus))
        start = time.monotonic()
        deadline = start + self.cfg.verify_timeout_s
        known = plan.identities()
        stuck_gpus = {g for t in plan.targets if t.pid in survivors for g in t.gpus}
        decided: dict[int, GpuResult] = {}
        for g in sorted(stuck_gpus):
            obs = GpuObservation(
                g, None, False, tuple(s for s in survivors.values() if _on(plan, s.pid, g))
            )
            decided[g] = await self.decide(plan, obs, None)
        killed_again: set[int] = set()
        # GPUs a restart policy, a pod, a job or a service may fill again: free must stay free.
        watch = {g for t in plan.targets if may_restart(t.workload) for g in t.gpus}
        free_since: dict[int, float] = {}
        last_error: str | None = None
        snap: NodeSnapshot | None = None
        while True:
            pending = [g for g in plan.gpus if g not in decided]
            if not pending:
                break
            try:
                snap = await self.svc.status.snapshot(self.node, gpu_indices=pending, names=False)
                self.last_snapshot = snap
                last_error = None
            except GpubotError as exc:
                snap, last_error = None, str(exc)
            now = time.monotonic()
            if snap is not None:
                for g in pending:
                    obs = await self.observe(plan, snap, g, known, pairs)
                    back = [p.pid for p in snap.on_gpu(g) if _planned(p, pairs)]
                    again = [p for p in back if p not in killed_again]
                    if again:  # a planned process still holds the device file: deal with it by PID
                        killed_again.update(again)
                        await self.send("KILL", {p: pairs[p] for p in again}, deaths)
                    if obs.verified and not obs.newcomers and g in watch:
                        free_since.setdefault(g, now)
                        if now - free_since[g] < self.cfg.respawn_watch_s:
                            continue  # free, but not yet for long enough to be sure
                    elif not obs.verified:
                        free_since.pop(g, None)
                    if obs.verified or obs.newcomers:
                        seconds = _since(plan, g, deaths, start, free_since.get(g, now))
                        decided[g] = await self.decide(plan, obs, seconds)
            if time.monotonic() >= deadline:
                for g in [g for g in plan.gpus if g not in decided]:
                    if snap is None:
                        obs = GpuObservation(g, None, False, error=last_error)
                    else:
                        obs = await self.observe(plan, snap, g, known, pairs)
                    decided[g] = await self.decide(plan, obs, None)
                break
            await asyncio.sleep(self.cfg.poll_interval_s)
        return tuple(decided[g] for g in plan.gpus)

    async def observe(
        self,
        plan: ResetPlan,
        snap: NodeSnapshot,
        g: int,
        known: set[tuple[int, int | None]],
        pairs: dict[int, tuple[int, int]],
    ) -> GpuObservation:
        """Read one GPU's state from a verification snapshot."""
        gpu = snap.gpu(g)
        mem = gpu.memory_used_mib if gpu else None
        procs = [p for p in snap.on_gpu(g) if p.exists]
        planned_left = [p for p in procs if _planned(p, pairs)]
        newcomers = tuple(
            [await self.newcomer(plan, p) for p in procs if (p.pid, p.start_ticks) not in known]
        )
        kept = tuple(
            Kept(p.pid, p.user, p.command or p.process_name, p.used_memory_mib)
            for p in procs if _protected(plan, p) and (p.used_memory_mib or 0) > 0
        ) + tuple(
            Kept(p.pid, p.user, p.process_name, p.used_memory_mib, protected=False)
            for p in snap.on_gpu(g)  # left alone as not in /proc, yet nvidia-smi gives it memory
            if not p.exists and p.visible_to_nvidia_smi and (p.used_memory_mib or 0) > 0
            and _left_alone(plan, p)
        )  # fmt: skip
        refused = tuple(
            f"pid {p.pid}: {self.refused[p.pid]}" for p in planned_left if p.pid in self.refused
        )
        limit = plan.expected_after_mib.get(g, 0) + self.cfg.free_threshold_mib
        verified = mem is not None and mem <= limit and not planned_left and not newcomers
        holders = len([p for p in procs if not _left_alone(plan, p)])
        blind = None
        if gpu is not None and gpu.minor is None:  # who holds its device file cannot be seen
            holders, blind = max(holders, 1), "its device file's holders cannot be seen"
        return GpuObservation(g, mem, verified, newcomers=newcomers, holders=holders, kept=kept,
                              not_signalled=refused, error=blind)  # fmt: skip

    async def newcomer(self, plan: ResetPlan, p: GpuProcess) -> Newcomer:
        """Describe a process that took a GPU after planning, with its parent and unit."""
        info = None
        if p.ppid:
            res = await self.svc.transport.run(
                self.node, proc_argv([p.ppid]),
                timeout=self.svc.settings.ssh.command_timeout_s,
            )  # fmt: skip
            info = parse_procs(res.stdout, [p.ppid]).get(p.ppid)
        cmd = p.command or p.process_name
        parent_cmd = info.command if info else None
        parent_w = info.workload if info else None
        either = parent_w or p.workload
        unit = either.short if either is not None else None
        return Newcomer(p.pid, p.user, cmd, p.ppid, parent_cmd, unit,
                        workload=as_planned(plan, p.workload or parent_w))  # fmt: skip

    async def decide(
        self, plan: ResetPlan, obs: GpuObservation, seconds: float | None
    ) -> GpuResult:
        """Classify one GPU and report it."""
        outcome, detail = classify(
            obs, plan.expected_after_mib.get(obs.index, 0), self.cfg.free_threshold_mib
        )
        res = GpuResult(
            obs.index, outcome, detail, plan.memory_before_mib.get(obs.index),
            obs.memory_after_mib, seconds if outcome is Outcome.FREED else None,
        )  # fmt: skip
        if outcome is Outcome.RESPAWNED and obs.newcomers[0].workload is not None:
            self.respawned[obs.index] = obs.newcomers[0].workload
        await self.emit("gpu_outcome", **res.to_dict())
        return res

    async def smi(self, *args: str) -> tuple[int, str]:
        """Run a privileged ``nvidia-smi ARGS`` (``sudo -n`` where configured); return its say."""
        argv = [self.node.nvidia_smi, *args]
        if self.node.sudo:
            argv = ["sudo", "-n", *argv]
        res = await self.svc.transport.run(
            self.node, argv, timeout=self.svc.settings.ssh.command_timeout_s
        )
        return res.exit_status, (res.stdout + res.stderr).strip()

    async def gpu_reset(
        self, plan: ResetPlan, gpu: int, *, toggle: bool = False
    ) -> tuple[GpuResult, ...]:
        """Run ``nvidia-smi --gpu-reset -i N`` and verify the GPU's memory is back.

        ``toggle``: persistence mode off before (the daemon lets the GPU go) and on after.
        """
        if not toggle:
            return await self._gpu_reset(plan, gpu)
        status, text = await self.smi("-pm", "0", "-i", str(gpu))
        await self.emit("persistence", gpu=gpu, mode=0, exit_status=status, output=text[-300:])
        try:
            return await self._gpu_reset(plan, gpu)
        finally:
            status, text = await self.smi("-pm", "1", "-i", str(gpu))
            await self.emit("persistence", gpu=gpu, mode=1, exit_status=status, output=text[-300:])

    async def _gpu_reset(self, plan: ResetPlan, gpu: int) -> tuple[GpuResult, ...]:
        status, text = await self.smi("--gpu-reset", "-i", str(gpu))
        await self.emit("gpu_reset", gpu=gpu, exit_status=status, output=text[-500:])
        # 14/15 (an infoROM warning, another GPU lost) still reset this one when it says so.
        done = status == 0 or (status in USABLE_EXIT and "was successfully reset" in text)
        if not done:
            obs = GpuObservation(gpu, None, False, error=f"nvidia-smi --gpu-reset: {text[:200]}")
            return (await self.decide(plan, obs, None),)
        return await self.verify(plan, {}, {}, {})

    async def final_snapshot(self) -> NodeSnapshot | None:
        """Take a full snapshot for the after table; None if the node does not answer."""
        try:
            return await self.svc.status.snapshot(self.node)
        except GpubotError:
            return self.last_snapshot


def _ids(pairs: dict[int, tuple[int, int]], pids: Iterable[int]) -> list[Identity]:
    return [(p, *pairs[p]) for p in sorted(pids)]


def _planned(p: GpuProcess, pairs: dict[int, tuple[int, int]]) -> bool:
    return p.pid in pairs and pairs[p.pid][0] == p.start_ticks


def _left_alone(plan: ResetPlan, p: GpuProcess) -> bool:
    return any(s.pid == p.pid and s.gpu == p.gpu_index for s in plan.skipped)


def _protected(plan: ResetPlan, p: GpuProcess) -> bool:
    """Whether ``p`` is a daemon the plan left alone as protected (same pid and start time)."""
    return any(s.protected and s.pid == p.pid and s.start_ticks == p.start_ticks
               and s.gpu == p.gpu_index for s in plan.skipped)  # fmt: skip


def _on(plan: ResetPlan, pid: int, g: int) -> bool:
    return any(t.pid == pid and g in t.gpus for t in plan.targets)


def _since(plan: ResetPlan, g: int, deaths: dict[int, float], start: float, now: float) -> float:
    """Seconds from the last target on GPU ``g`` dying to now (or from verification start)."""
    times = [deaths[t.pid] for t in plan.targets if g in t.gpus and t.pid in deaths]
    return round(now - (max(times) if times else start), 3)
