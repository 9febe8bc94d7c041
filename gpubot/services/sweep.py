"""Sweeps: look at every node within a budget, raise findings, hand them to the alert keeper.

A node that does not answer within the budget is ``node-slow``, never holding up the others.
This service takes the lock, probes, asks the nodes with orphaned GPUs what a reset would touch,
and records the sweep; the pure work runs off the loop, so a Slack ack never waits behind it.

``run(alerting=False)``, a sweep by hand, leaves the alert state alone, so it never confirms a
finding early. ``scheduled()`` takes the sweep lock: one replica sweeps, once an interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gpubot.config import Settings
from gpubot.core.alerting import SweepResult, confirmed
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import Finding, NodeFailure, classify_failure, find
from gpubot.core.health.codes import RESET_WHEN_IDLE
from gpubot.core.health.kinds import KINDS
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import AuditLog, Clock, Locks, SweepObserver, Transport
from gpubot.core.reset.readiness import Readiness, readiness, ready_argv
from gpubot.core.timefmt import iso
from gpubot.errors import DUTY_TURN, GpubotError, LockHeld, StoreError
from gpubot.services.alert_keeper import AlertKeeper, ReadinessMap
from gpubot.services.digest import DigestService
from gpubot.services.health_checks import HealthChecks
from gpubot.services.idle_accounting import IdleAccounting, IdleTimes
from gpubot.services.ladder import ReclaimLadder
from gpubot.services.offload import off_loop, release
from gpubot.services.status import StatusService, fan_out, reason
from gpubot.services.sweep_scope import scope
from gpubot.services.usage import UsageService
from gpubot.services.xid_watch import XidWatch

log = logging.getLogger(__name__)

SWEEP_LOCK = "sweep"  # the lock a replica holds while it sweeps
# Findings another service makes of a sweep's snapshots (``ClaimService.intruder_findings``).
ExtraFindings = Callable[[Sequence[NodeSnapshot], float], Awaitable[list[Finding]]]
RECENT = 0.9  # a replica skips its turn if a sweep started within this part of an interval


@dataclass(frozen=True)
class SweepPorts:
    """What a sweep works with besides the nodes. Without ``keeper`` a sweep reports but never
    alerts; without ``idle`` no GPU is ever found idle (nothing remembers what earlier sweeps
    saw); without ``audit`` sweeps are not recorded, and (without ``locks``) every replica
    sweeps on its own schedule."""

    audit: AuditLog | None = None
    keeper: AlertKeeper | None = None
    idle: IdleAccounting | None = None
    locks: Locks | None = None
    observer: SweepObserver | None = None
    health: HealthChecks | None = None  # GPU health fields; None: not read
    xid: XidWatch | None = None  # reads each node's kernel log for Xid/SXid ([sweep] kernel_log)
    usage: UsageService | None = None  # GPU-hours: counted at every sweep
    ladder: ReclaimLadder | None = None  # idle holders climb it, instead of the plain alert
    digest: DigestService | None = None  # the weekly GPU-hours digest, checked by each sweep
    extra: tuple[ExtraFindings, ...] = ()  # more findings of the snapshots (claims, Slurm)
    heap: Callable[[], AbstractContextManager[object]] | None = None  # lifecycle.SweepHeap


class SweepService:
    """Sweeps the fleet; the scheduler, the CLI and ``/gpu sweep`` call this one service."""

    def __init__(
        self,
        settings: Settings,
        status: StatusService,
        transport: Transport,
        ports: SweepPorts = SweepPorts(),
        *,
        clock: Clock = SYSTEM_CLOCK,
        replica: str | None = None,
    ) -> None:
        """``status`` snapshots the nodes; ``transport`` asks them about readiness."""
        self.settings = settings
        self.config = settings.sweep
        self.status = status
        self.transport = transport
        self.audit = ports.audit
        self.keeper = ports.keeper
        self.idle = ports.idle
        self.locks = ports.locks
        self.observer = ports.observer
        self.health = ports.health
        self.xid = ports.xid
        self.usage = ports.usage
        self.ladder = ports.ladder
        self.digest = ports.digest
        self.extra = ports.extra
        self.clock = clock
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self._snaps: dict[str, NodeSnapshot] = {}  # each node's latest, for readiness
        self._last: tuple[tuple[str, ...], frozenset[str]] | None = None  # nodes, failed
        self._found: frozenset[str] = frozenset()  # nodes of the last sweep's findings
        self._ends = 0.0  # when this sweep's node budget ends (monotonic)
        self.heap = ports.heap  # around each sweep: the collector (``lifecycle.SweepHeap``)

    @property
    def actor(self) -> str:
        return f"gpubot:{self.replica}"

    def node_budget_s(self) -> float:
        """Return the time nodes get to answer: the budget, less a reserve for alerting."""
        budget = self.config.budget_s
        return max(0.1, budget - min(5.0, budget * 0.2))

    # -- sweeping ------------------------------------------------------------------------------

    async def scheduled(self) -> SweepResult:
        """Sweep if no other replica is sweeping or swept in this interval (the scheduler's job)."""
        if self.locks is None:
            return await self.run(alerting=True, source="schedule")
        try:
            async with self.locks.hold(SWEEP_LOCK, holder="sweep"):
                last = await self._last_scheduled_start()
                if last is not None and self.clock.now() - last < RECENT * self.config.interval_s:
                    return self._skipped(f"another replica swept at {iso(last)}")
                return await self.run(alerting=True, source="schedule")
        except LockHeld as exc:
            return self._skipped(str(exc))
        except StoreError as exc:
            log.warning("sweep skipped: %s", exc, extra=DUTY_TURN)
            return self._skipped(str(exc))

    def _skipped(self, why: str) -> SweepResult:
        log.info("sweep skipped: %s", why)
        return SweepResult(self.clock.now(), 0.0, (), skipped=why)

    async def _last_scheduled_start(self) -> float | None:
        """Return when another replica's latest scheduled sweep started. This replica's own are
        left out: its scheduler spaces them, and one that began late must not cost the next its
        turn. One from the future (a clock stepped back) is ignored, or it would skip every
        sweep until the clock caught up."""
        if self.audit is None:
            return None
        now = self.clock.now()
        since = datetime.fromtimestamp(now - self.config.interval_s, UTC)
        latest = now + RECENT * self.config.interval_s
        starts = []
        for r in await self.audit.queries(since=since, limit=1000):
            data = r.data
            if r.actor == self.actor or r.source != "schedule" or not isinstance(data, dict):
                continue
            if data.get("query") == "sweep":
                start = r.time.timestamp() - float(data.get("seconds") or 0.0)
                if start <= latest:
                    starts.append(start)
        return max(starts, default=None)

    async def run(
        self, *, alerting: bool = True, source: str = "schedule", actor: str | None = None
    ) -> SweepResult:
        with nullcontext() if self.heap is None else self.heap():
            return await self._run(alerting=alerting, source=source, actor=actor)

    async def _run(self, *, alerting: bool, source: str, actor: str | None) -> SweepResult:
        nodes = self.status.resolve(["all"])
        started = self.clock.now()
        t0 = self.clock.monotonic()
        scoped = await scope(self.settings, self.status.prom, nodes, self._kept)
        budget = max(0.1, self.node_budget_s() - (self.clock.monotonic() - t0))  # less Prometheus's
        snaps, failed, timed_out = await self._probe(scoped.probe, budget)
        seconds = self.clock.monotonic() - t0
        idle = IdleTimes(started) if self.idle is None else await self.idle.sweep(snaps, started)
        if self.usage is not None:
            await self.usage.record(snaps, started)
        protection = self.settings.reset.protection
        findings = await off_loop(
            find,
            snaps,
            failed,
            self.config,
            protection=protection,
            idle=idle.gpus,
            held=idle.held,
            at=started,
        )
        if self.health is not None:
            findings += await self.health.findings(snaps, advance=alerting, at=started)
        if self.xid is not None:
            findings = (*findings, *self.xid.findings(snaps))
        for extra in self.extra:
            findings = (*findings, *await extra(snaps, started))
        findings = scoped.tag(findings)
        self._found = frozenset(f.node for f in findings)
        names = tuple(n.name for n in nodes)
        result = SweepResult(
            started, seconds, names, tuple(snaps), failed, tuple(timed_out), findings
        )
        result = replace(
            result, vouched=scoped.vouched, named=dict(scoped.named), notes=scoped.notes
        )
        retired = [old for s in snaps if (old := self._snaps.get(s.node)) is not None]
        for s in snaps:
            self._snaps[s.node] = s
        if self.keeper is not None:
            self.keeper.saw(snaps)
        await off_loop(release, retired)  # freed in the worker, not in one step of the loop
        await self._record(result, actor or self.actor, source)
        result = await self._alert(result) if alerting else await self._report(result)
        if alerting and self.digest is not None:
            await self.digest.run_due()
        if self.observer is not None:
            self.observer.observe_sweep(
                result.snapshots, list(result.failed), result.seconds, self._open_counts(result)
            )
        return result

    async def _kept(self) -> frozenset[str]:
        """The nodes probed whatever Prometheus says: those of this process's last findings
        (failures included) and of open alerts (a restart's too), since only a probe that
        looked may clear one."""
        known = {} if self.keeper is None else await self.keeper.known()
        return self._found | {k.node for k in known}

    async def _alert(self, result: SweepResult) -> SweepResult:
        """Hand the findings to the alert keeper (none: report them only); with the reclaim
        ladder on, idle holders climb it instead of being alerted."""
        if self.ladder is None or not self.ladder.enabled:
            return await self._keep(result)
        await self.ladder.climb(result)
        rest = tuple(f for f in result.findings if not f.kind.ladder)
        kept = await self._keep(replace(result, findings=rest))
        return replace(kept, findings=result.findings)

    async def _keep(self, result: SweepResult) -> SweepResult:
        if self.keeper is None:
            return await self._report(result)
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        try:
            return await self.keeper.update(result, self._readiness_of, now=now)
        except StoreError as exc:  # the findings stand; alerting waits for the next sweep
            log.error("sweep alerts not updated: %s", exc, extra=DUTY_TURN)
            return result

    async def _probe(
        self, nodes: Sequence[NodeConfig], budget_s: float
    ) -> tuple[list[NodeSnapshot], dict[str, NodeFailure], list[str]]:
        self._ends = self.clock.monotonic() + budget_s  # the health checks fit in what is left
        res = await fan_out(
            nodes,
            self._look,
            self.settings.ssh.max_parallel,
            budget_s=budget_s,
            budget_name="sweep budget",
        )
        failed = {n: NodeFailure(classify_failure(e), reason(e, n)) for n, e in res.failed.items()}
        timed_out = [n for n, e in res.failed.items() if isinstance(e, TimeoutError)]
        return list(res.ok.values()), failed, timed_out

    async def _look(self, node: NodeConfig) -> NodeSnapshot:
        """Snapshot ``node``; with the Xid watch, read its kernel log at the same time; with
        health checks, then read its health (one more exec)."""
        snap = await self._snapshot(node)
        if self.health is None:
            return snap
        # Within what is left of the budget (less a reserve): a slow health exec leaves the
        # node's health unknown, never its probe's answer lost.
        left = self._ends - self.clock.monotonic() - 0.5
        return await self.health.attach(node, snap, within_s=left)

    async def _snapshot(self, node: NodeConfig) -> NodeSnapshot:
        if self.xid is None:
            return await self.status.snapshot(node)
        read = asyncio.ensure_future(self.xid.read(node))
        try:
            snap = await self.status.snapshot(node)
        except GpubotError:
            await read  # a failed probe too: the kernel may say why (an Xid 79)
            raise
        except BaseException:
            read.cancel()  # cancelled, or out of the budget: its read ends with it
            raise
        await read  # bounded by its own timeout; cancelled with this task by the budget
        return snap

    async def _record(self, result: SweepResult, actor: str, source: str) -> None:
        """Record the sweep: a process's first names every node, later ones what changed."""
        failed = {n: f.reason for n, f in result.failed.items()}
        changed = self._changed(result.nodes, failed.keys())
        if self.audit is None:
            return
        try:
            await self.audit.record_query(
                kind="sweep",
                actor=actor,
                source=source,
                nodes=result.nodes,
                failed=failed,
                seconds=result.seconds,
                changed=changed,
            )
        except StoreError as exc:
            log.warning("sweep not recorded in the audit log: %s", exc, extra=DUTY_TURN)

    def _changed(self, nodes: Sequence[str], failed: Iterable[str]) -> dict[str, list[str]] | None:
        """Return the nodes added, removed and recovered since the previous sweep (None: this
        is the process's first, so its record names every node)."""
        before, self._last = self._last, (tuple(nodes), frozenset(failed))
        if before is None:
            return None
        names, earlier = set(nodes), set(before[0])
        return {
            "added": sorted(names - earlier),
            "removed": sorted(earlier - names),
            "recovered": sorted((before[1] & names) - self._last[1]),
        }

    async def _report(self, result: SweepResult) -> SweepResult:
        """Read-only: add the readiness of orphaned GPUs and what the store knows."""
        ready = await self._readiness_of(result.findings)
        known = {} if self.keeper is None else await self.keeper.known()
        return replace(result, readiness=ready, known=known)

    async def _readiness_of(self, findings: Iterable[Finding]) -> ReadinessMap:
        """Ask each node with orphaned GPUs what a reset would touch, all nodes at once."""
        orphaned: dict[str, list[int]] = {}
        for f in findings:
            if f.gpu is not None and (f.kind.gpu_reset or f.next_step == RESET_WHEN_IDLE):
                orphaned.setdefault(f.node, []).append(f.gpu)
        names = list(orphaned)
        answers = await asyncio.gather(*(self._readiness(n, orphaned[n]) for n in names))
        return {
            (n, g): r for n, ready in zip(names, answers, strict=True) for g, r in ready.items()
        }

    async def _readiness(self, node_name: str, gpus: Sequence[int]) -> dict[int, Readiness]:
        node = self.status.node(node_name)
        snap = self._snaps.get(node_name)
        # The alerting reserve of the budget bounds this question, not the command timeout alone.
        timeout = min(self.settings.ssh.command_timeout_s, max(2.0, self.config.budget_s * 0.15))
        argv = ready_argv(node.nvidia_smi, gpus, max(1.0, timeout - 1.0))
        try:
            res = await self.transport.run(node, argv, timeout=timeout)
        except GpubotError as exc:
            return readiness(snap, gpus, None, why_unknown=reason(exc, node_name))
        return readiness(snap, gpus, res.stdout)

    def _open_counts(self, result: SweepResult) -> dict[str, int]:
        """Return confirmed open findings by kind, zeros included: one seen once, or by hand
        only, is not open yet."""
        counts = {k.value: 0 for k in KINDS}
        for f in result.findings:
            state = result.known.get(f.key)
            if state is not None and confirmed(f.kind, state):
                counts[f.kind.value] += 1
        return counts
