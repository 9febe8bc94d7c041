"""The reset engine: plan → audit intent → SIGTERM → grace → SIGKILL → device holders → verify.

Only planned processes are ever signalled, each after an identity check on the node (pid, start
time and owner, in the same exec as the signal); no fixed sleeps; a GPU is called freed only
when ``nvidia-smi`` shows its memory back where expected.

A reset holds its node's lease (``Locks``) from before its intent to after its outcome, and
fences every audit write with it. A reset that stops on an error after something went out to
the node raises ``ResetInterrupted``: it lists what was sent, and each targeted GPU is
``unknown`` (in the audit outcome too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from gpubot.config import Settings
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.models import ActionStatus, NodeConfig, NodeSnapshot, Outcome
from gpubot.core.nodelog import Attribution
from gpubot.core.policy import Person
from gpubot.core.ports import AuditStore, Clock, Locks, ResetObserver, Transport
from gpubot.core.reset.cutoff import interrupted_message, unknown_gpus
from gpubot.core.reset.outcome import GpuResult
from gpubot.core.reset.plan import ResetPlan, ResetRequest, plan_reset
from gpubot.errors import GpubotError, ResetInterrupted, ResetRefused, UsageError
from gpubot.services.locks import NodeLocks
from gpubot.services.reset_run import ResetRun
from gpubot.services.run_state import EventSink, ResetEvent, RunDeps
from gpubot.services.status import StatusService

__all__ = ["EventSink", "NodeLocks", "ResetEvent"]  # re-exported


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
        return all(g.outcome is Outcome.FREED for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action_id": self.action_id,
            "plan": self.plan.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "gpus": [g.to_dict() for g in self.gpus],
            "ok": self.ok,
        }


def reset_lock(node: str) -> str:
    return f"reset:{node}"


@dataclass(frozen=True)
class Ask:
    """One request as it travels from a front end through the services into its audit record:
    who asks, as typed, from which front end, the grace asked for, where its events go."""

    who: Person
    command: str
    source: str
    grace_s: float | None = None  # None: [reset] grace_s
    on_event: EventSink | None = None

    @classmethod
    def by(
        cls,
        actor: str,
        source: str,
        command: str,
        *,
        grace_s: float | None = None,
        on_event: EventSink | None = None,
    ) -> Ask:
        """Return an ask of someone known by id only (the CLI's user, an approver's run)."""
        return cls(Person(actor, actor, None), command, source, grace_s, on_event)


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
        *,
        clock: Clock = SYSTEM_CLOCK,
        after_forced: Callable[[int | None], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.store = store
        self.status = status
        self.clock = clock
        self.locks: Locks = locks or NodeLocks(clock)
        self.observer = observer
        # Told (the action id, None if it never began) after every forced reset: the audit seal.
        self.after_forced = after_forced

    def run_deps(self) -> RunDeps:
        """Return what a reset in progress uses (read now: a test may swap the clock)."""
        return RunDeps(
            self.transport,
            self.status,
            self.store,
            self.clock,
            self.settings.reset,
            self.settings.ssh.command_timeout_s,
        )

    async def _observed(self, work: Awaitable[ResetResult]) -> ResetResult:
        if self.observer is None:
            return await work
        try:
            result = await work
        except ResetRefused:
            self.observer.count_reset(ActionStatus.REFUSED)
            raise
        except Exception:
            self.observer.count_reset(ActionStatus.ERROR)
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
        ask: Ask,
        *,
        before: NodeSnapshot | None = None,
        approval: Mapping[str, Any] | None = None,
    ) -> ResetResult:
        """Run a planned reset; the intent is audited before any signal (fail closed).

        ``approval``: the request's id, who asked for a forced kill and who approved it
        (``approvals.approval_record``), recorded with the intent.
        """
        node = self.status.node(plan.node)
        grace = self.settings.reset.grace_s if ask.grace_s is None else ask.grace_s

        async def body(run: ResetRun) -> tuple[tuple[GpuResult, ...], NodeSnapshot]:
            snap = before if before is not None else await self.status.snapshot(node)
            return await run.reset(plan, grace, snap), snap

        intent = {**plan.to_dict(), "approval_id": None if approval is None else approval["id"]}
        if approval is not None:
            intent["approval"] = dict(approval)
        work = self._audited("reset", ask, node, plan, intent, body)
        return await self._sealed(plan, self._observed(work))

    async def _sealed(self, plan: ResetPlan, work: Awaitable[ResetResult]) -> ResetResult:
        if not plan.forced or self.after_forced is None:
            return await work
        action_id: int | None = None
        try:
            result = await work
            action_id = result.action_id
            return result
        finally:
            await self.after_forced(action_id)

    async def gpu_reset(self, node_name: str, gpu: int, ask: Ask) -> ResetResult:
        return await self._observed(self._gpu_reset(node_name, gpu, ask))

    async def _gpu_reset(self, node_name: str, gpu: int, ask: Ask) -> ResetResult:
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

        async def body(run: ResetRun) -> tuple[tuple[GpuResult, ...], NodeSnapshot]:
            return await run.gpu_reset(plan, gpu, toggle=bool(daemons)), before

        return await self._audited("gpu-reset", ask, node, plan, plan.to_dict(), body)

    async def _audited(
        self,
        kind: str,
        ask: Ask,
        node: NodeConfig,
        plan: ResetPlan,
        intent: dict[str, Any],
        body: Callable[[ResetRun], Awaitable[tuple[tuple[GpuResult, ...], NodeSnapshot]]],
    ) -> ResetResult:
        """Hold the node's lease, write the intent, run ``body``, write the outcome (fail
        closed); every write is fenced by the lease."""
        async with self.locks.hold(reset_lock(node.name), holder=ask.who.id) as lease:
            if lease.took_over is not None:  # the audit log has the takeover's own record too
                intent = {**intent, "lease": {"took_over": lease.took_over}}
            action_id = await self.store.begin_action(
                kind=kind,
                actor=ask.who.id,
                source=ask.source,
                command=ask.command,
                node=node.name,
                gpus=plan.gpus,
                plan=intent,
                fence=lease.fence,
            )
            approval = intent.get("approval")
            who = Attribution.of(
                ask.who.id,
                ask.who.name,
                action_id,
                approval if isinstance(approval, dict) else None,
            )
            run = ResetRun(
                self.run_deps(), node, action_id, ask.on_event, lease, attribution=who, kind=kind
            )
            gpus: tuple[GpuResult, ...] | None = None
            try:
                gpus, before = await body(run)
                after = await run.final_snapshot()
                result = ResetResult(
                    node.name, plan, gpus, tuple(run.steps), before, after, action_id
                )
                await self.store.finish_action(
                    action_id,
                    status=ActionStatus.FREED if result.ok else ActionStatus.NOT_FREED,
                    result=result.to_dict(),
                    fence=lease.fence,
                )
                return result
            except BaseException as exc:
                doc = interrupted(run, plan, exc, gpus)
                with suppress(GpubotError):  # if even that fails it stays visibly incomplete
                    await self.store.finish_action(action_id, status=ActionStatus.ERROR, result=doc)
                if isinstance(exc, GpubotError) and doc["sent"]:
                    why = interrupted_message(node.name, doc["error"], run.sent(), plan.gpus)
                    raise ResetInterrupted(why, doc) from exc
                raise


def interrupted(
    run: ResetRun, plan: ResetPlan, exc: BaseException, known: tuple[GpuResult, ...] | None
) -> dict[str, Any]:
    """Return the outcome of a reset stopped by ``exc``: the error, what was sent, each GPU
    (``known``: as verified, when only recording the outcome failed; else ``unknown``).

    Written without the fence: it records what happened, even (above all) once the lease is
    gone; it signals nothing.
    """
    error = str(exc) or type(exc).__name__
    sent = run.sent()
    gpus = known if known is not None else unknown_gpus(plan.gpus, error) if sent else ()
    return {
        "node": run.node.name,
        "action_id": run.action_id,
        "error": error,
        "sent": [s.to_dict() for s in sent],
        "gpus": [g.to_dict() for g in gpus],
        "steps": [s.to_dict() for s in run.steps],
        "ok": False,
    }
