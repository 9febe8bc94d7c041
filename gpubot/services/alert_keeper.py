"""The alert keeper: a sweep's findings through the alert state, to the ``Notifier``.

The decisions (two sweeps to alert, reminders, hysteresis, snoozes) are pure
(``core.alerting``); this keeper orchestrates the ``AlertStore`` and the ``Notifier``. An alert
is posted once through the outbox, and every alerting sweep first settles the posts whose end
is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from gpubot.core.alerting import (
    Alert,
    AlertGroup,
    AlertItem,
    MessageRef,
    Notice,
    PendingPost,
    SweepResult,
    by_message,
    digest_label,
    hold_clears,
    notice,
    snooze_until,
    to_resolve,
)
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import Finding, FindingKey, SweepConfig
from gpubot.core.health.kinds import parse_key
from gpubot.core.maint import WindowStore, quiet_nodes
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import AlertStore, Clock, Notifier
from gpubot.core.reset.readiness import Readiness
from gpubot.errors import DUTY_TURN, StoreError, UsageError
from gpubot.services.outbox import ALERT, Outbox

log = logging.getLogger(__name__)

ReadinessMap = dict[tuple[str, int], Readiness]
AskReadiness = Callable[[Iterable[Finding]], Awaitable[ReadinessMap]]


class AlertKeeper:
    """The alert state machine over the ``AlertStore``, the notifier, and snoozing."""

    def __init__(
        self,
        config: SweepConfig,
        nodes: Iterable[str],
        alerts: AlertStore,
        notifier: Notifier | None,
        outbox: Outbox[Any] | None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        slurm_nodes: Iterable[str] = (),
        maint: WindowStore | None = None,
    ) -> None:
        """``nodes``: every configured node (an alert of a node no longer configured clears);
        ``slurm_nodes``: those Slurm owns (their drain findings offer a Drain button).
        Without ``notifier`` the state is kept but nothing is posted (and that is warned);
        ``outbox``: what posts each alert once (settled every sweep, under the sweep's lock);
        ``maint``: the maintenance windows, during which a node's findings are recorded but
        neither posted nor reminded of (they post after the window if still there)."""
        self.maint = maint
        self.config = config
        self.nodes = frozenset(nodes)
        self.slurm_nodes = frozenset(slurm_nodes)
        self.alerts = alerts
        self.notifier = notifier
        self.clock = clock
        self.outbox = outbox if notifier is not None else None
        # What this process saw last: details for re-rendering messages (the store keeps keys).
        self._findings: dict[str, Finding] = {}
        self._ready: dict[str, Readiness] = {}
        self._snaps: dict[str, NodeSnapshot] = {}
        # Alerted findings not found by the last sweeps that looked: how many (hysteresis). Kept
        # by this process: after a restart, a finding clearing takes its two sweeps again.
        self._clearing: dict[FindingKey, int] = {}

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def saw(self, snaps: Sequence[NodeSnapshot]) -> None:
        for s in snaps:
            self._snaps[s.node] = s

    async def known(self) -> dict[FindingKey, Alert]:
        """Return the open alerts by key ({} when the store cannot say: warned)."""
        try:
            return {a.key: a for a in await self.alerts.open_alerts()}
        except StoreError as exc:
            log.warning("alert state unavailable: %s", exc, extra=DUTY_TURN)
            return {}

    async def update(
        self, result: SweepResult, ask: AskReadiness, *, now: datetime | None = None
    ) -> SweepResult:
        now = now or self._now()
        found = {f.key: f for f in result.findings}
        states = {a.key: a for a in await self.alerts.upsert_seen(list(found), now)}
        for k, f in found.items():
            self._findings[k.text()] = f
        open_ = {a.key: a for a in await self.alerts.open_alerts()}
        settled: tuple[FindingKey, ...] = ()
        if self.outbox is not None and self.notifier is not None:  # before anything posts
            settled = await self.outbox.reconcile_alerts(
                self.notifier, lambda p: self._pending_group(p, open_), now
            )
        resolved = await self.alerts.mark_resolved(self._cleared(result, found, open_), now)
        quiet = await self._quiet(now)
        held = {k: f for k, f in found.items() if f.node not in quiet}
        new, remind = self._due(held, states, now)
        ready = await ask(f for fs in new.values() for f in fs)
        alerted = settled + await self._post(new, states, ready, now)
        if alerted:  # their state changed: alerted, and where
            states.update({a.key: a for a in await self.alerts.open_alerts() if a.key in states})
        reminded = await self._remind(remind, states, now)
        for where in dict.fromkeys(a.ref for a in resolved if a.ref is not None):
            await self._update_message(where, now)
        return replace(
            result,
            readiness=ready,
            alerted=alerted,
            reminded=reminded,
            resolved=tuple(a.key for a in resolved),
            known=states,
        )

    async def _quiet(self, now: datetime) -> frozenset[str]:
        """Return the nodes in an open maintenance window; if the windows cannot be read, none
        (a page too many beats a page missed)."""
        if self.maint is None:
            return frozenset()
        at = now.timestamp()
        try:
            return quiet_nodes(await self.maint.live(at), at)
        except StoreError as exc:
            log.warning("maintenance windows unread, alerts not held: %s", exc, extra=DUTY_TURN)
            return frozenset()

    def _cleared(
        self,
        result: SweepResult,
        found: Mapping[FindingKey, Finding],
        open_: Mapping[FindingKey, Alert],
    ) -> list[FindingKey]:
        cleared = to_resolve(
            list(open_),
            found.keys(),
            answered={s.node for s in result.snapshots},
            failed=result.failed.keys(),
            configured=self.nodes,
        )
        alerted = {k for k, a in open_.items() if a.alerted_at is not None}
        unseen = open_.keys() - found.keys() - set(cleared)
        gone, self._clearing = hold_clears(cleared, alerted, self._clearing, unseen=unseen)
        return gone

    def _due(
        self, found: Mapping[FindingKey, Finding], states: Mapping[FindingKey, Alert], now: datetime
    ) -> tuple[dict[str, list[Finding]], dict[MessageRef, list[Finding]]]:
        remind: dict[MessageRef, list[Finding]] = {}
        alert: list[Finding] = []
        for k, f in found.items():
            what = notice(f.kind, states[k], now, self.config)
            if what is Notice.ALERT:
                alert.append(f)
            elif what is Notice.REMIND and (where := states[k].ref) is not None:
                remind.setdefault(where, []).append(f)
        new = by_message(alert)
        if self.notifier is None and (new or remind):
            log.warning(
                "findings to alert on %s, but no alert channel is set up",
                ", ".join(
                    sorted({*(f.node for f in alert), *(fs[0].node for fs in remind.values())})
                ),
            )
        return ({}, {}) if self.notifier is None else (new, remind)

    async def _post(
        self,
        new: Mapping[str, list[Finding]],
        states: dict[FindingKey, Alert],
        ready: Mapping[tuple[str, int], Readiness],
        now: datetime,
    ) -> tuple[FindingKey, ...]:
        """Post one alert per message of new findings (a node's, or a digest: ``by_message``),
        each through the outbox (recorded before it is posted: ``services.outbox``);
        return the keys alerted."""
        alerted: list[FindingKey] = []
        for node, fs in new.items():
            assert self.outbox is not None and self.notifier is not None  # findings to post
            items = []
            for f in fs:
                r = ready.get((f.node, f.gpu)) if f.gpu is not None else None
                if r is not None:
                    self._ready[f.key.text()] = r
                items.append(AlertItem(f.key, f, states[f.key].first_seen, readiness=r))
            group = self.group(node, tuple(items), now)
            alerted += await self.outbox.post_alert(group, self.notifier)
        return tuple(alerted)

    def _pending_group(
        self, pending: PendingPost, open_: Mapping[FindingKey, Alert]
    ) -> AlertGroup | None:
        """Rebuild the message of a pending post from its findings still open (None: none)."""
        items = tuple(self._item(k, open_[k]) for k in pending.keys if k in open_)
        if not items:
            return None
        node = pending.subject.removeprefix(ALERT)
        return self.group(node, items, self._now())

    def group(self, node: str, items: tuple[AlertItem, ...], now: datetime) -> AlertGroup:
        """Return one alert message's group of ``node`` (a digest's label) as of ``now``."""
        snap = self._snaps.get(node)
        return AlertGroup(node, items, snap, now, slurm_nodes=self.slurm_nodes)

    async def _remind(
        self,
        remind: Mapping[MessageRef, list[Finding]],
        states: dict[FindingKey, Alert],
        now: datetime,
    ) -> tuple[FindingKey, ...]:
        reminded: list[FindingKey] = []
        for where, fs in remind.items():
            assert self.notifier is not None
            node = digest_label(f.key for f in fs)
            items = tuple(self._item(f.key, states[f.key]) for f in fs)
            await self.notifier.remind(where, self.group(node, items, now))
            for f in fs:
                states[f.key] = await self.alerts.mark_reminded(f.key, now)
                reminded.append(f.key)
        return tuple(reminded)

    def _item(self, key: FindingKey, a: Alert) -> AlertItem:
        text = key.text()
        return AlertItem(
            key,
            self._findings.get(text),
            a.first_seen,
            a.resolved_at,
            a.snoozed_until,
            self._ready.get(text),
        )

    async def _update_message(self, where: MessageRef, now: datetime) -> None:
        if self.notifier is None:
            return
        members = await self.alerts.on_message(where)
        if not members:
            return
        items = tuple(self._item(a.key, a) for a in members)
        node = digest_label(a.key for a in members)
        await self.notifier.update(where, self.group(node, items, now))

    async def snooze(self, key_text: str, choice: str, *, by: str) -> Alert:
        """Snooze one finding for ``1h`` or ``1d`` and update its alert message."""
        key = parse_key(key_text)
        now = self._now()
        try:
            until = snooze_until(now, choice)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        alert = await self.alerts.snooze(key, until, by=by, now=now)
        if alert.ref is not None:
            await self._update_message(alert.ref, now)
        return alert


class Snoozer(Protocol):
    """What a front end's snooze button calls (``AlertKeeper``; ``NoAlerts`` without a store)."""

    async def snooze(self, key_text: str, choice: str, *, by: str) -> Alert:
        """Snooze one finding; raise ``GpubotError`` with why it cannot be."""
        ...


class NoAlerts:
    """Stands in for the keeper without a database: snoozing is refused with why."""

    async def snooze(self, key_text: str, choice: str, *, by: str) -> Alert:
        """Refuse: there is no alert state."""
        raise StoreError("the alert state is unavailable (no database)")
