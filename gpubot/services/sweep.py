"""Sweeps: look at every node within a budget, raise findings, alert once, remind, resolve.

A sweep snapshots every node concurrently; a node that does not answer before the budget is
spent is reported (``node-unreachable``) and never holds up the others. Findings go through the
alert state (the ``AlertStore`` port): a finding alerts once it was seen in two sweeps in a row,
reminds after ``reminder_s``, and its message is updated when it clears. The decisions are pure
(``gpubot.core.findings``, ``gpubot.core.alerting``); this service only orchestrates ports.
An alert is posted once, through the outbox (``services.alert_outbox``): its intent is recorded
before it is posted, and every alerting sweep first settles the posts whose end is unknown.

``run(alerting=False)`` is the read-only sweep of ``gpubot sweep`` and ``/gpu sweep``: it reports
and records the query, but leaves the alert state alone (so a sweep by hand never confirms a
finding early). ``scheduled()`` is what the scheduler calls: it takes the sweep lock, so only
one replica sweeps at a time and only once an interval.

Every sweep, by hand or scheduled, stores one utilisation sample per GPU through the
``SampleStore`` port and prunes those older than ``[sweep] keep_samples``; GPUs whose samples say
0 % for ``idle_hours`` make idle-holder findings (``gpubot.core.idle``), and the GPU-hours each
owner has held idle are in the result (``idle_gpu_hours``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from gpubot.config import Settings
from gpubot.core.alerting import (
    Alert,
    AlertGroup,
    AlertItem,
    Handle,
    Notice,
    PendingPost,
    SweepResult,
    confirmed,
    held_idle_hours,
    notice,
    snooze_until,
    to_resolve,
)
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import Finding, FindingKey, NodeFailure, classify_failure, find
from gpubot.core.idle import held_idle, idle_gpus, samples_of
from gpubot.core.models import FindingKind, NodeConfig, NodeSnapshot
from gpubot.core.ports import (
    AlertStore,
    AuditLog,
    Clock,
    Locks,
    Notifier,
    SampleStore,
    SweepObserver,
)
from gpubot.core.readiness import Readiness, readiness, ready_argv
from gpubot.core.timefmt import iso
from gpubot.errors import GpubotError, LockHeld, StoreError, UsageError
from gpubot.services.alert_outbox import AlertOutbox
from gpubot.services.status import StatusService, fan_out, reason

log = logging.getLogger(__name__)

SWEEP_LOCK = "sweep"  # the lock a replica holds while it sweeps
RECENT = 0.9  # a replica skips its turn if a sweep started within this part of an interval


class SweepService:
    """Sweeps the fleet; the scheduler, the CLI and ``/gpu sweep`` call this one service."""

    def __init__(
        self,
        settings: Settings,
        status: StatusService,
        *,
        audit: AuditLog | None = None,
        alerts: AlertStore | None = None,
        samples: SampleStore | None = None,
        locks: Locks | None = None,
        notifier: Notifier | None = None,
        observer: SweepObserver | None = None,
        clock: Clock = SYSTEM_CLOCK,
        replica: str | None = None,
    ) -> None:
        """Without ``alerts`` a sweep reports but never alerts; without ``samples`` no GPU is
        ever found idle (nothing remembers what earlier sweeps saw); without ``audit`` sweeps
        are not recorded, and every replica sweeps on its own schedule."""
        self.settings = settings
        self.config = settings.sweep
        self.status = status
        self.audit = audit
        self.alerts = alerts
        self.samples = samples
        self.locks = locks
        self.notifier = notifier
        self.observer = observer
        self.clock = clock
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self.outbox = (
            AlertOutbox(alerts, notifier) if alerts is not None and notifier is not None else None
        )
        # What this process saw last: details for re-rendering messages (the store keeps keys).
        self._findings: dict[str, Finding] = {}
        self._ready: dict[str, Readiness] = {}
        self._snaps: dict[str, NodeSnapshot] = {}

    @property
    def actor(self) -> str:
        """Return the audit actor of scheduled sweeps."""
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
            log.warning("sweep skipped: %s", exc)
            return self._skipped(str(exc))

    def _skipped(self, why: str) -> SweepResult:
        log.info("sweep skipped: %s", why)
        return SweepResult(self.clock.now(), 0.0, (), skipped=why)

    async def _last_scheduled_start(self) -> float | None:
        """Return when the latest scheduled sweep recorded in the audit log started."""
        if self.audit is None:
            return None
        since = datetime.fromtimestamp(self.clock.now() - self.config.interval_s, UTC)
        starts = []
        for r in await self.audit.queries(since=since, limit=1000):
            data = r.data
            if r.source == "schedule" and isinstance(data, dict) and data.get("query") == "sweep":
                starts.append(r.time.timestamp() - float(data.get("seconds") or 0.0))
        return max(starts, default=None)

    async def run(
        self, *, alerting: bool = True, source: str = "schedule", actor: str | None = None
    ) -> SweepResult:
        """Sweep every node now; with ``alerting``, update the alert state and notify."""
        nodes = self.status.resolve(["all"])
        started = self.clock.now()
        t0 = self.clock.monotonic()
        snaps, failed, timed_out = await self._probe(nodes, self.node_budget_s())
        seconds = self.clock.monotonic() - t0
        idle = await self._idle(snaps, started)
        await self._keep_samples(snaps, started)
        findings = find(snaps, failed, self.config, protection=self.settings.reset.protection,
                        idle=idle)  # fmt: skip
        result = SweepResult(
            started, seconds, tuple(n.name for n in nodes), tuple(snaps), failed,
            tuple(timed_out), findings,
        )  # fmt: skip
        for s in snaps:
            self._snaps[s.node] = s
        await self._record(result, actor or self.actor, source)
        if alerting and self.alerts is not None:
            try:
                result = await self._alert(result)
            except StoreError as exc:  # the findings stand; alerting waits for the next sweep
                log.error("sweep alerts not updated: %s", exc)
        else:
            result = await self._report(result)
        if self.observer is not None:
            self.observer.observe_sweep(
                result.snapshots, list(result.failed), result.seconds, self._open_counts(result)
            )
        return result

    async def _probe(
        self, nodes: Sequence[NodeConfig], budget_s: float
    ) -> tuple[list[NodeSnapshot], dict[str, NodeFailure], list[str]]:
        """Snapshot ``nodes`` concurrently; whoever has not answered within ``budget_s`` failed."""
        res = await fan_out(nodes, self.status.snapshot, self.settings.ssh.max_parallel,
                            budget_s=budget_s, budget_name="sweep budget")  # fmt: skip
        failed = {n: NodeFailure(classify_failure(e), reason(e, n)) for n, e in res.failed.items()}
        timed_out = [n for n, e in res.failed.items() if isinstance(e, TimeoutError)]
        return list(res.ok.values()), failed, timed_out

    # -- GPU samples and idle GPUs ----------------------------------------------------------

    async def _idle(
        self, snaps: Sequence[NodeSnapshot], now: float
    ) -> dict[tuple[str, int], float]:
        """Return ``{(node, gpu): seconds held idle}`` of the GPUs idle for the idle window.

        Two reads, each only of GPUs held idle now: the window (are they idle long enough?),
        then, for those that are, every sample kept (since when?). A store that fails leaves no
        GPU idle: unknown is not idle.
        """
        rule, gap = self.config.idle, self.config.max_gap_s
        if not rule.enabled or self.samples is None:
            return {}
        current = [s for s in samples_of(snaps, now) if held_idle(s, rule.min_mib)]
        if not current:
            return {}
        try:
            window = await self.samples.samples_since(
                now - rule.window_s - gap, gpus={(s.node, s.gpu) for s in current}
            )
            idle = idle_gpus(current, window, rule, max_gap_s=gap)
            if not idle:
                return {}
            kept = await self.samples.samples_since(now - rule.keep_s, gpus=idle.keys())
        except StoreError as exc:
            log.warning("idle GPUs not looked for: %s", exc)
            return {}
        return idle_gpus([s for s in current if (s.node, s.gpu) in idle], kept, rule,
                         max_gap_s=gap)  # fmt: skip

    async def _keep_samples(self, snaps: Sequence[NodeSnapshot], now: float) -> None:
        """Store this sweep's samples (one insert) and prune those older than ``keep_samples``."""
        if self.samples is None:
            return
        try:
            await self.samples.add_samples(samples_of(snaps, now))
            await self.samples.prune_samples(now - self.config.idle.keep_s)
        except StoreError as exc:  # the sweep stands; idle detection misses this sample
            log.warning("GPU samples not stored: %s", exc)

    async def idle_gpu_hours(self, snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
        """Return the GPU-hours each owner holds idle now, for ``snapshots`` (the Home tab)."""
        idle = await self._idle(snapshots, self.clock.now())
        if not idle:
            return {}
        found = find(snapshots, {}, self.config, protection=self.settings.reset.protection,
                     idle=idle)  # fmt: skip
        return held_idle_hours(found)

    async def _record(self, result: SweepResult, actor: str, source: str) -> None:
        if self.audit is None:
            return
        failed = {n: f.reason for n, f in result.failed.items()}
        try:
            await self.audit.record_query(kind="sweep", actor=actor, source=source,
                                          nodes=result.nodes, failed=failed,
                                          seconds=result.seconds)  # fmt: skip
        except StoreError as exc:
            log.warning("sweep not recorded in the audit log: %s", exc)

    async def _report(self, result: SweepResult) -> SweepResult:
        """Read-only: add the readiness of orphaned GPUs and what the store knows."""
        ready = await self._readiness_of(result.findings)
        known: dict[FindingKey, Alert] = {}
        if self.alerts is not None:
            try:
                known = {a.key: a for a in await self.alerts.open_alerts()}
            except StoreError as exc:
                log.warning("alert state unavailable: %s", exc)
        return replace(result, readiness=ready, known=known)

    async def _readiness_of(self, findings: Iterable[Finding]) -> dict[tuple[str, int], Readiness]:
        """Ask each node with orphaned GPUs what a reset would touch, all nodes at once."""
        orphaned: dict[str, list[int]] = {}
        for f in findings:
            if f.kind is FindingKind.ORPHANED_VRAM and f.gpu is not None:
                orphaned.setdefault(f.node, []).append(f.gpu)
        names = list(orphaned)
        answers = await asyncio.gather(*(self._readiness(n, orphaned[n]) for n in names))
        return {
            (n, g): r for n, ready in zip(names, answers, strict=True) for g, r in ready.items()
        }

    async def _readiness(self, node_name: str, gpus: Sequence[int]) -> dict[int, Readiness]:
        """Ask one node (one exec); what it cannot say stays unknown."""
        node = self.status.node(node_name)
        snap = self._snaps.get(node_name)
        # The alerting reserve of the budget bounds this question, not the command timeout alone.
        timeout = min(self.settings.ssh.command_timeout_s, max(2.0, self.config.budget_s * 0.15))
        argv = ready_argv(node.nvidia_smi, gpus, max(1.0, timeout - 1.0))
        try:
            res = await self.status.transport.run(node, argv, timeout=timeout)
        except GpubotError as exc:
            return readiness(snap, gpus, None, why_unknown=reason(exc, node_name))
        return readiness(snap, gpus, res.stdout)

    # -- alert state ---------------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    async def _alert(self, result: SweepResult) -> SweepResult:
        """Update the alert state with this sweep's findings: alert, remind, resolve."""
        assert self.alerts is not None
        now = self._now()
        found = {f.key: f for f in result.findings}
        states = {a.key: a for a in await self.alerts.upsert_seen(list(found), now)}
        for k, f in found.items():
            self._findings[k.text()] = f
        open_ = {a.key: a for a in await self.alerts.open_alerts()}
        open_keys = list(open_)
        settled: tuple[FindingKey, ...] = ()
        if self.outbox is not None:  # posts whose end is unknown, before anything else posts
            settled = await self.outbox.reconcile(
                lambda p, at: self._pending_group(p, at, open_), now
            )
        gone = to_resolve(open_keys, found.keys(), answered={s.node for s in result.snapshots},
                          failed=result.failed.keys(),
                          configured={n.name for n in self.settings.nodes})  # fmt: skip
        resolved = await self.alerts.mark_resolved(gone, now)
        new, remind = self._due(found, states, now)
        ready = await self._readiness_of(f for fs in new.values() for f in fs)
        alerted = settled + await self._post(new, states, ready, now)
        if alerted:  # their state changed: alerted, and where
            states.update({a.key: a for a in await self.alerts.open_alerts() if a.key in states})
        reminded = await self._remind(remind, states, now)
        cleared = {h: a.key.node for a in resolved if (h := a.handle) is not None}
        for where, node in cleared.items():
            await self._update_message(where, node, now)
        return replace(result, readiness=ready, alerted=alerted, reminded=reminded,
                       resolved=tuple(a.key for a in resolved), known=states)  # fmt: skip

    def _due(
        self, found: Mapping[FindingKey, Finding], states: Mapping[FindingKey, Alert], now: datetime
    ) -> tuple[dict[str, list[Finding]], dict[Handle, list[Finding]]]:
        """Return the findings to alert on (by node) and to remind of (by message)."""
        new: dict[str, list[Finding]] = {}
        remind: dict[Handle, list[Finding]] = {}
        for k, f in found.items():
            what = notice(f.kind, states[k], now, self.config)
            if what is Notice.ALERT:
                new.setdefault(f.node, []).append(f)
            elif what is Notice.REMIND and (where := states[k].handle) is not None:
                remind.setdefault(where, []).append(f)
        if self.notifier is None and (new or remind):
            log.warning(
                "findings to alert on %s, but no alert channel is set up",
                ", ".join(sorted({*new, *(fs[0].node for fs in remind.values())})),
            )
        return ({}, {}) if self.notifier is None else (new, remind)

    async def _post(
        self,
        new: Mapping[str, list[Finding]],
        states: dict[FindingKey, Alert],
        ready: Mapping[tuple[str, int], Readiness],
        now: datetime,
    ) -> tuple[FindingKey, ...]:
        """Post one alert per node of new findings, each through the outbox (recorded before
        it is posted: ``services.alert_outbox``); return the keys alerted."""
        alerted: list[FindingKey] = []
        for node, fs in new.items():
            assert self.outbox is not None  # findings to post: a notifier and a store
            items = []
            for f in fs:
                r = ready.get((node, f.gpu)) if f.gpu is not None else None
                if r is not None:
                    self._ready[f.key.text()] = r
                items.append(AlertItem(f.key, f, states[f.key].first_seen, readiness=r))
            group = AlertGroup(node, tuple(items), self._snaps.get(node), now)
            alerted += await self.outbox.post(group)
        return tuple(alerted)

    def _pending_group(
        self, pending: PendingPost, repeat_of: datetime | None, open_: Mapping[FindingKey, Alert]
    ) -> AlertGroup | None:
        """Rebuild the message of a pending post from its findings still open (None: none)."""
        items = tuple(self._item(k, open_[k]) for k in pending.keys if k in open_)
        if not items:
            return None
        node = pending.node
        return AlertGroup(node, items, self._snaps.get(node), self._now(), repeat_of=repeat_of)

    async def _remind(
        self, remind: Mapping[Handle, list[Finding]], states: dict[FindingKey, Alert], now: datetime
    ) -> tuple[FindingKey, ...]:
        """Remind of findings that persist, in their alert's thread; return the keys reminded."""
        reminded: list[FindingKey] = []
        for where, fs in remind.items():
            assert self.notifier is not None and self.alerts is not None
            node = fs[0].node
            group = AlertGroup(node, tuple(self._item(f.key, states[f.key]) for f in fs),
                               self._snaps.get(node), now)  # fmt: skip
            await self.notifier.remind(where, group)
            for f in fs:
                states[f.key] = await self.alerts.mark_reminded(f.key, now)
                reminded.append(f.key)
        return tuple(reminded)

    def _item(self, key: FindingKey, a: Alert) -> AlertItem:
        text = key.text()
        return AlertItem(key, self._findings.get(text), a.first_seen, a.resolved_at,
                         a.snoozed_until, self._ready.get(text))  # fmt: skip

    async def _update_message(self, where: Handle, node: str, now: datetime) -> None:
        """Re-render one alert message from the state of every finding it carries."""
        if self.notifier is None or self.alerts is None:
            return
        members = await self.alerts.on_message(*where)
        if not members:
            return
        items = tuple(self._item(a.key, a) for a in members)
        await self.notifier.update(where, AlertGroup(node, items, self._snaps.get(node), now))

    async def snooze(self, key_text: str, choice: str, *, by: str) -> Alert:
        """Snooze one finding for ``1h`` or ``1d`` and update its alert message."""
        if self.alerts is None:
            raise StoreError("the alert state is unavailable (no database)")
        key = FindingKey.parse(key_text)
        now = self._now()
        try:
            until = snooze_until(now, choice)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        alert = await self.alerts.snooze(key, until, by=by, now=now)
        if alert.handle is not None:
            await self._update_message(alert.handle, key.node, now)
        return alert

    def _open_counts(self, result: SweepResult) -> dict[str, int]:
        """Return confirmed open findings by kind (every kind, zeros included).

        Confirmed as the scheduled sweeps count: a finding seen once (or by a sweep by hand
        only) is not open yet.
        """
        counts = {k.value: 0 for k in FindingKind}
        now = datetime.fromtimestamp(result.started_at, UTC)
        for f in result.findings:
            state = result.known.get(f.key)
            if state is not None and confirmed(f.kind, state, now, self.config):
                counts[f.kind.value] += 1
        return counts
