"""Sweeps: look at every node within a budget, raise findings, alert once, remind, resolve.

A sweep snapshots every node concurrently; a node that does not answer before the budget is
spent is reported (``node-unreachable``) and never holds up the others. Findings go through the
alert state in the store (``store.alerts``): a finding alerts once it was seen in two sweeps in
a row, reminds after ``reminder_s``, and its message is updated when it clears. The decisions
are pure (``gpubot.core.findings``); this service only orchestrates ports.

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
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gpubot.config import Settings
from gpubot.core.findings import (
    Finding,
    Key,
    NodeFailure,
    Notice,
    Readiness,
    SweepConfig,
    classify_failure,
    confirmed,
    find,
    notice,
    readiness,
    ready_argv,
    snooze_until,
    to_resolve,
)
from gpubot.core.idle import gpu_hours_by_owner, held_idle, idle_gpus, samples_of
from gpubot.core.models import FindingKind, NodeConfig, NodeSnapshot
from gpubot.core.ports import SampleStore
from gpubot.errors import GpubotError, LockHeld, StoreError, UsageError
from gpubot.services.status import StatusService, reason
from gpubot.store import Alert, FindingKey, Store
from gpubot.store.locks import SWEEP_LOCK, DbLocks, replica_name

log = logging.getLogger(__name__)

Handle = tuple[str, str]  # (channel, message ts)
RECENT = 0.9  # a replica skips its turn if a sweep started within this part of an interval


# --- what the front end gets ------------------------------------------------------------------


@dataclass(frozen=True)
class AlertItem:
    """One finding of an alert message, as it stands now."""

    key: FindingKey
    finding: Finding | None  # None: only the key is known (seen by another replica or run)
    first_seen: datetime
    resolved_at: datetime | None = None
    snoozed_until: datetime | None = None
    readiness: Readiness | None = None


@dataclass(frozen=True)
class AlertGroup:
    """The findings of one node in one alert message (its per-GPU table when known)."""

    node: str
    items: tuple[AlertItem, ...]
    snapshot: NodeSnapshot | None
    at: datetime

    @property
    def open(self) -> tuple[AlertItem, ...]:
        """Return the items not resolved yet."""
        return tuple(i for i in self.items if i.resolved_at is None)


class Notifier(Protocol):
    """Posts and updates alert messages (Slack); implementations log failures and never raise."""

    async def post(self, group: AlertGroup) -> Handle | None:
        """Post a new alert; return where it is (None: not posted)."""
        ...

    async def update(self, where: Handle, group: AlertGroup) -> None:
        """Replace an alert message by the group's current state."""
        ...

    async def remind(self, where: Handle, group: AlertGroup) -> None:
        """Remind of findings that persist (in the alert's thread)."""
        ...


class SweepObserver(Protocol):
    """Receives each sweep's numbers (the metrics)."""

    def observe_sweep(
        self,
        snapshots: Sequence[NodeSnapshot],
        failed: Sequence[str],
        seconds: float,
        open_findings: Mapping[str, int],
    ) -> None:
        """Record one sweep."""
        ...


@dataclass(frozen=True)
class SweepResult:
    """What one sweep saw and did."""

    started_at: float  # unix time
    seconds: float
    nodes: tuple[str, ...]
    snapshots: tuple[NodeSnapshot, ...] = ()
    failed: dict[str, NodeFailure] = field(default_factory=dict)
    timed_out: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    readiness: dict[tuple[str, int], Readiness] = field(default_factory=dict)
    alerted: tuple[Key, ...] = ()
    reminded: tuple[Key, ...] = ()
    resolved: tuple[Key, ...] = ()
    known: dict[Key, Alert] = field(default_factory=dict)  # stored state of each finding
    skipped: str | None = None  # why this replica did not sweep

    @property
    def idle_gpu_hours(self) -> dict[str, float]:
        """Return the GPU-hours each owner's idle holders have held idle so far, most first."""
        return held_idle_hours(self.findings)

    @property
    def ok(self) -> bool:
        """Whether the sweep ran, every node answered, and nothing was found."""
        return self.skipped is None and not self.failed and not self.findings

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` document."""

        def key(k: Key) -> dict[str, Any]:
            return {"node": k.node, "gpu": k.gpu, "kind": k.kind, "holder": k.holder}

        findings = []
        for f in self.findings:
            d = f.to_dict()
            ready = self.readiness.get((f.node, f.gpu)) if f.gpu is not None else None
            d["readiness"] = ready.to_dict() if ready else None
            state = self.known.get(f.key)
            d["alerted_at"] = _iso(state.alerted_at) if state else None
            d["seen_count"] = state.seen_count if state else None
            findings.append(d)
        return {
            "started_at": _iso(datetime.fromtimestamp(self.started_at, UTC)),
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "nodes": list(self.nodes),
            "answered": [s.node for s in self.snapshots],
            "failed": {
                n: {"kind": f.kind.value, "reason": f.reason} for n, f in self.failed.items()
            },
            "timed_out": list(self.timed_out),
            "findings": findings,
            "alerted": [key(k) for k in self.alerted],
            "reminded": [key(k) for k in self.reminded],
            "resolved": [key(k) for k in self.resolved],
            "idle_gpu_hours": {u: round(h, 2) for u, h in self.idle_gpu_hours.items()},
        }


def held_idle_hours(findings: Iterable[Finding]) -> dict[str, float]:
    """Return GPU-hours held idle per owner, from the idle-holder findings."""
    return gpu_hours_by_owner(
        (f.owner, f.node, f.gpu, f.idle_s)
        for f in findings
        if f.kind is FindingKind.IDLE_HOLDER and f.gpu is not None and f.idle_s is not None
    )


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def store_key(key: Key) -> FindingKey:
    """Return the store's form of a finding key."""
    return FindingKey(key.node, key.gpu, key.kind, key.holder)


def core_key(key: FindingKey) -> Key:
    """Return the core's form of a stored finding key."""
    return Key(key.node, key.gpu, key.kind, key.holder)


def parse_key(text: str) -> FindingKey:
    """Parse ``FindingKey.text()`` back (from a button's value); raise ``UsageError``."""
    try:
        node, gpu, kind, holder = json.loads(text)
        key = FindingKey(str(node), None if gpu == "-" else int(gpu), str(kind), str(holder))
    except (ValueError, TypeError):
        raise UsageError(f"not a finding key: {text[:80]!r}") from None
    if key.kind not in {k.value for k in FindingKind}:
        raise UsageError(f"not a finding kind: {key.kind!r}")
    return key


# --- the service ------------------------------------------------------------------------------


class SweepService:
    """Sweeps the fleet; the scheduler, the CLI and ``/gpu sweep`` call this one service."""

    def __init__(
        self,
        settings: Settings,
        config: SweepConfig,
        status: StatusService,
        store: Store | None,
        *,
        notifier: Notifier | None = None,
        locks: DbLocks | None = None,
        observer: SweepObserver | None = None,
        clock: Callable[[], float] = time.time,
        replica: str | None = None,
        samples: SampleStore | None = None,
    ) -> None:
        """``samples`` defaults to the store's (``Store.samples``); without either, no GPU is
        ever found idle (nothing remembers what earlier sweeps saw)."""
        self.settings = settings
        self.config = config
        self.status = status
        self.store = store
        self.notifier = notifier
        self.locks = locks
        self.observer = observer
        self.clock = clock
        self.replica = replica or replica_name()
        self.samples: SampleStore | None = samples or (store.samples if store is not None else None)
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
                if last is not None and time.time() - last < RECENT * self.config.interval_s:
                    when = datetime.fromtimestamp(last, UTC)
                    return self._skipped(f"another replica swept at {_iso(when)}")
                return await self.run(alerting=True, source="schedule")
        except LockHeld as exc:
            return self._skipped(str(exc))
        except StoreError as exc:
            log.warning("sweep skipped: %s", exc)
            return self._skipped(str(exc))

    def _skipped(self, why: str) -> SweepResult:
        log.info("sweep skipped: %s", why)
        return SweepResult(self.clock(), 0.0, (), skipped=why)

    async def _last_scheduled_start(self) -> float | None:
        """Return when the latest scheduled sweep recorded in the audit log started."""
        if self.store is None:
            return None
        since = datetime.now(UTC) - timedelta(seconds=self.config.interval_s)
        starts = []
        for r in await self.store.queries(since=since, limit=1000):
            data = r.data
            if r.source == "schedule" and isinstance(data, dict) and data.get("query") == "sweep":
                starts.append(r.time.timestamp() - float(data.get("seconds") or 0.0))
        return max(starts, default=None)

    async def run(
        self, *, alerting: bool = True, source: str = "schedule", actor: str | None = None
    ) -> SweepResult:
        """Sweep every node now; with ``alerting``, update the alert state and notify."""
        nodes = self.status.resolve(["all"])
        started = self.clock()
        t0 = time.monotonic()
        snaps, failed, timed_out = await self._probe(nodes, self.node_budget_s())
        seconds = time.monotonic() - t0
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
        if alerting and self.store is not None:
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
        """Snapshot ``nodes`` concurrently; whoever has not answered by the deadline failed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        gate = asyncio.Semaphore(max(1, self.settings.ssh.max_parallel))
        spent = object()

        async def one(node: NodeConfig) -> NodeSnapshot | object:
            cm = asyncio.timeout_at(deadline)
            try:
                async with cm, gate:
                    return await self.status.snapshot(node)
            except TimeoutError:
                if cm.expired():
                    return spent
                raise

        results = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
        snaps: list[NodeSnapshot] = []
        failed: dict[str, NodeFailure] = {}
        timed_out: list[str] = []
        for node, res in zip(nodes, results, strict=True):
            if isinstance(res, NodeSnapshot):
                snaps.append(res)
            elif res is spent:
                why = f"no answer within the sweep budget ({budget_s:g} s)"
                failed[node.name] = NodeFailure(FindingKind.NODE_UNREACHABLE, why)
                timed_out.append(node.name)
            elif isinstance(res, GpubotError):
                failed[node.name] = NodeFailure(classify_failure(res), reason(res, node.name))
                if isinstance(res, TimeoutError):
                    timed_out.append(node.name)
            elif isinstance(res, Exception):
                log.error("sweep of %s failed", node.name, exc_info=res)
                why = f"internal error: {res!r}"
                failed[node.name] = NodeFailure(FindingKind.NODE_UNREACHABLE, why)
            elif isinstance(res, BaseException):
                raise res  # cancellation and interrupts are not a node's failure
        return snaps, failed, timed_out

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
        idle = await self._idle(snapshots, self.clock())
        if not idle:
            return {}
        found = find(snapshots, {}, self.config, protection=self.settings.reset.protection,
                     idle=idle)  # fmt: skip
        return held_idle_hours(found)

    async def _record(self, result: SweepResult, actor: str, source: str) -> None:
        if self.store is None:
            return
        failed = {n: f.reason for n, f in result.failed.items()}
        try:
            await self.store.record_query(kind="sweep", actor=actor, source=source,
                                          nodes=result.nodes, failed=failed,
                                          seconds=result.seconds)  # fmt: skip
        except StoreError as exc:
            log.warning("sweep not recorded in the audit log: %s", exc)

    async def _report(self, result: SweepResult) -> SweepResult:
        """Read-only: add the readiness of orphaned GPUs and what the store knows."""
        ready = await self._readiness_of(result.findings)
        known: dict[Key, Alert] = {}
        if self.store is not None:
            try:
                known = {core_key(a.key): a for a in await self.store.alerts.open_alerts()}
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
        return datetime.fromtimestamp(self.clock(), UTC)

    async def _alert(self, result: SweepResult) -> SweepResult:
        assert self.store is not None
        alerts = self.store.alerts
        now = self._now()
        found = {f.key: f for f in result.findings}
        states = {core_key(a.key): a for a in await alerts.upsert_seen(
            [store_key(k) for k in found], now)}  # fmt: skip
        for k, f in found.items():
            self._findings[store_key(k).text()] = f

        open_keys = [core_key(a.key) for a in await alerts.open_alerts()]
        gone = to_resolve(open_keys, found.keys(), answered={s.node for s in result.snapshots},
                          failed=result.failed.keys(),
                          configured={n.name for n in self.settings.nodes})  # fmt: skip
        resolved = await alerts.mark_resolved([store_key(k) for k in gone], now)

        new: dict[str, list[Finding]] = {}
        remind: dict[Handle, list[Finding]] = {}
        for k, f in found.items():
            what = notice(f.kind, states[k], now, self.config)
            if what is Notice.ALERT:
                new.setdefault(f.node, []).append(f)
            elif what is Notice.REMIND:
                a = states[k]
                if a.channel and a.message_ts:
                    remind.setdefault((a.channel, a.message_ts), []).append(f)
        if self.notifier is None:
            if new or remind:
                log.warning(
                    "findings to alert on %s, but no alert channel is set up",
                    ", ".join(sorted({*new, *(fs[0].node for fs in remind.values())})),
                )
            new, remind = {}, {}

        alerted: list[Key] = []
        ready_all = await self._readiness_of(f for fs in new.values() for f in fs)
        for node, fs in new.items():
            items = []
            for f in fs:
                r = ready_all.get((node, f.gpu)) if f.gpu is not None else None
                if r is not None:
                    self._ready[store_key(f.key).text()] = r
                items.append(AlertItem(store_key(f.key), f, states[f.key].first_seen, readiness=r))
            assert self.notifier is not None
            where = await self.notifier.post(AlertGroup(node, tuple(items),
                                                        self._snaps.get(node), now))  # fmt: skip
            if where is None:
                continue  # not posted: the next sweep tries again
            for f in fs:
                states[f.key] = await alerts.mark_alerted(
                    store_key(f.key), channel=where[0], message_ts=where[1], now=now
                )
                alerted.append(f.key)

        reminded: list[Key] = []
        for where, fs in remind.items():
            assert self.notifier is not None
            node = fs[0].node
            group = AlertGroup(node, tuple(self._item(store_key(f.key), states[f.key]) for f in fs),
                               self._snaps.get(node), now)  # fmt: skip
            await self.notifier.remind(where, group)
            for f in fs:
                states[f.key] = await alerts.mark_reminded(store_key(f.key), now)
                reminded.append(f.key)

        cleared: dict[Handle, str] = {}
        for a in resolved:
            if a.channel and a.message_ts:
                cleared[(a.channel, a.message_ts)] = a.key.node
        for where, node in cleared.items():
            await self._update_message(where, node, now)
        return replace(result, readiness=ready_all, alerted=tuple(alerted),
                       reminded=tuple(reminded), resolved=tuple(core_key(a.key) for a in resolved),
                       known=states)  # fmt: skip

    def _item(self, key: FindingKey, a: Alert) -> AlertItem:
        text = key.text()
        return AlertItem(key, self._findings.get(text), a.first_seen, a.resolved_at,
                         a.snoozed_until, self._ready.get(text))  # fmt: skip

    async def _update_message(self, where: Handle, node: str, now: datetime) -> None:
        """Re-render one alert message from the state of every finding it carries."""
        if self.notifier is None or self.store is None:
            return
        members = await self.store.alerts.on_message(*where)
        if not members:
            return
        items = tuple(self._item(a.key, a) for a in members)
        await self.notifier.update(where, AlertGroup(node, items, self._snaps.get(node), now))

    async def snooze(self, key_text: str, choice: str, *, by: str) -> Alert:
        """Snooze one finding for ``1h`` or ``1d`` and update its alert message."""
        if self.store is None:
            raise StoreError("the alert state is unavailable (no database)")
        key = parse_key(key_text)
        now = self._now()
        try:
            until = snooze_until(now, choice)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        alert = await self.store.alerts.snooze(key, until, by=by, now=now)
        if alert.channel and alert.message_ts:
            await self._update_message((alert.channel, alert.message_ts), key.node, now)
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
