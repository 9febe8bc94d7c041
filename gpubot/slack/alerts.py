"""Sweep alerts in Slack: one message per node's new findings, reminders, resolution, snooze.

An alert message carries, per finding, what was found (and for orphaned memory the reset
readiness list), a "Reset GPU N" button (the normal plan → approval flow) and "Snooze 1 h" /
"Snooze 1 day" buttons, then the node's per-GPU table. When a finding clears, the message is
updated in place to "resolved" with how long it lasted; a reminder goes to the alert's thread.

An alert on idle holders is also sent, once, as a direct message to each owner that maps to
Slack users (``slack.idle_dm``: *Free it* and *Snooze 1 day*). Opening a DM needs the optional
``im:write`` scope; a DM that cannot be sent is logged and changes nothing else.

``start_sweeps`` wires sweeps into ``gpubot serve``: the scheduler, the Slack notifier, the
snooze and "Free it" buttons, ``/gpu sweep``, the Home tab's idle figures, the database locks
and the metrics endpoint.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError

from gpubot.app import App
from gpubot.chat.blocks import (
    MAX_FALLBACK,
    Budget,
    Message,
    clip,
    code_safe,
    context,
    date,
    escape,
    header,
    node_lines,
    node_rows,
    section,
    table,
    table_fits,
)
from gpubot.chat.flows import Sweeper, error_message
from gpubot.chat.reset_view import reset_button
from gpubot.config import Settings
from gpubot.core.findings import TITLES, SweepConfig, check_port, duration_text, load_sweep_config
from gpubot.core.models import FindingKind
from gpubot.errors import GpubotError
from gpubot.metrics import Metrics, instrument_resets
from gpubot.scheduler import SweepScheduler
from gpubot.services.approvals import Identity
from gpubot.services.sweep import AlertGroup, AlertItem, Handle, SweepResult, SweepService
from gpubot.slack.api import SlackApi
from gpubot.slack.app import GpuBot
from gpubot.slack.idle_dm import register_free_it, render_idle_dm, slack_users_of
from gpubot.store.locks import DbLocks

log = logging.getLogger(__name__)

ACTION_SNOOZE = "gpubot_snooze_"  # + "1h" | "1d"; the value is the finding's key text
SNOOZE_ACTION = re.compile(r"^gpubot_snooze_(1h|1d)$")
SNOOZE_LABELS = {"1h": "Snooze 1 h", "1d": "Snooze 1 day"}
MAX_ITEMS = 12  # findings detailed in one message (3 blocks each); the rest are counted
RESET_KINDS = frozenset({FindingKind.ORPHANED_VRAM, FindingKind.ZOMBIE_PROCESS,
                         FindingKind.HIDDEN_HOLDER, FindingKind.IDLE_HOLDER})  # fmt: skip


# --- rendering ----------------------------------------------------------------------------------


def _where(item: AlertItem) -> str:
    return "node" if item.key.gpu is None else f"GPU {item.key.gpu}"


def _title(item: AlertItem) -> str:
    try:
        return TITLES[FindingKind(item.key.kind)]
    except ValueError:
        return item.key.kind


def _summary(item: AlertItem) -> str:
    if item.finding is not None:
        return item.finding.summary
    pid = item.key.holder.split(":", 1)[0]
    return f"pid {pid}" if pid else ""


def snooze_buttons(key_text: str) -> list[dict[str, Any]]:
    """Return the "Snooze 1 h" / "Snooze 1 day" buttons of one finding."""
    return [
        {"type": "button", "action_id": f"{ACTION_SNOOZE}{choice}", "value": key_text,
         "text": {"type": "plain_text", "text": label}}
        for choice, label in SNOOZE_LABELS.items()
    ]  # fmt: skip


def _item_text(item: AlertItem, now: datetime) -> str:
    # Each part is clipped, so that the state line always fits the section's 3000 characters.
    summary = clip(escape(_summary(item)), 600)
    lines = []
    if item.resolved_at is not None:
        lasted = duration_text((item.resolved_at - item.first_seen).total_seconds())
        lines.append(f"✅ ~{escape(_where(item))}: {escape(_title(item))}~ — "
                     f"*resolved* after {lasted}")  # fmt: skip
        if summary:
            lines.append(f"_{summary}_")
        return "\n".join(lines)
    lines.append(f"⚠ *{escape(_where(item))}: {escape(_title(item))}*")
    if summary:
        lines.append(summary)
    if item.finding is not None and item.finding.owner:
        lines.append(f"owner: {clip(escape(item.finding.owner), 200)}")
    if item.readiness is not None:
        lines.append("_before a GPU reset:_\n" + "\n".join(
            f"• {clip(escape(line), 250)}" for line in item.readiness.lines()))  # fmt: skip
    state = f"first seen {date(item.first_seen.timestamp())}"
    if item.snoozed_until is not None and item.snoozed_until > now:
        state += f" · 🔕 snoozed until {date(item.snoozed_until.timestamp())}"
    lines.append(state)
    return "\n".join(lines)


def _actions(item: AlertItem, now: datetime) -> dict[str, Any] | None:
    if item.resolved_at is not None:
        return None
    elements = []
    if item.key.gpu is not None and item.key.kind in RESET_KINDS:
        elements.append(reset_button(item.key.node, item.key.gpu))
    elements += snooze_buttons(item.key.text())
    return {"type": "actions", "elements": elements}


def render_alert_group(group: AlertGroup) -> Message:
    """Render the alert message of one node's findings, as they stand now."""
    now = group.at
    open_n, total = len(group.open), len(group.items)
    if open_n == 0:
        title = f"✅ {group.node}: resolved"
    elif open_n == total:
        title = f"⚠ {group.node}: {total} finding{'s' if total != 1 else ''}"
    else:
        title = f"⚠ {group.node}: {open_n} of {total} findings open"
    b = Budget()
    b.add(header(title))
    reserve = 3  # the table, "more not shown", the context line
    shown = 0
    for item in group.items[:MAX_ITEMS]:
        acts = _actions(item, now)
        if b.room <= reserve + (2 if acts else 1):
            break
        b.add(section(_item_text(item, now)))
        if acts is not None:
            b.add(acts)
        shown += 1
    if shown < total:
        b.add(context(f"… and {total - shown} more finding(s) on {escape(group.node)}"))
    snap = group.snapshot
    if snap is not None and snap.gpus:
        rows = node_rows(snap)
        if table_fits(rows):
            b.add(table(rows, wrap=(3, 4)))
        else:
            b.add_pre(node_lines(snap)[1:], reserve=1)
    b.add(context(f"gpubot sweep · {date(now.timestamp())}"))
    parts = [f"{_where(i)} {_title(i)}" + (" (resolved)" if i.resolved_at else "")
             for i in group.items]  # fmt: skip
    fallback = escape(clip(f"{title}: " + "; ".join(parts), MAX_FALLBACK))
    return {"text": fallback, "blocks": b.blocks}


def render_reminder(group: AlertGroup) -> Message:
    """Render a reminder of findings that persist (posted in the alert's thread)."""
    now = group.at
    lines = []
    for item in group.items[:40]:
        lasted = duration_text((now - item.first_seen).total_seconds())
        lines.append(f"• {escape(_where(item))}: {escape(_title(item))} — open for {lasted}")
    more = len(group.items) - min(len(group.items), 40)
    if more:
        lines.append(f"… and {more} more")
    text = f"⏰ *Still open on {escape(group.node)}:*\n" + "\n".join(lines)
    return {"text": clip(f"Still open on {group.node}", MAX_FALLBACK), "blocks": [section(text)]}


def render_sweep(result: SweepResult) -> Message:
    """Render a sweep's report (``/gpu sweep``)."""
    if result.skipped:
        return {"text": f"Sweep skipped: {escape(result.skipped)}",
                "blocks": [section(f"Sweep skipped: {escape(result.skipped)}")]}  # fmt: skip
    n, bad, found = len(result.nodes), len(result.failed), len(result.findings)
    title = f"Sweep: {n} node(s), {bad} failing, {found} finding(s)"
    b = Budget()
    b.add(header(title))
    if not result.findings:
        b.add(section("✅ No zombie processes, orphaned memory or failing nodes found."))
    lines = []
    for f in result.findings:
        where = f"{f.node} GPU {f.gpu}" if f.gpu is not None else f.node
        lines.append(code_safe(f"{where}: {f.kind.value}: {f.summary}"))
        ready = result.readiness.get((f.node, f.gpu)) if f.gpu is not None else None
        if ready is not None:
            lines += [code_safe(f"    {line}") for line in ready.lines()]
    if lines:
        done = b.add_pre(lines, reserve=2)
        if done < len(lines):
            b.add(context(f"… {len(lines) - done} more lines: `gpubot sweep` shows all"))
    idle = result.idle_gpu_hours
    if idle:
        held = " · ".join(f"{escape(u)} {h:.1f}" for u, h in list(idle.items())[:20])
        b.add(context(f"GPU-hours held idle: {held}"))
    b.add(context(f"{n} node(s) asked in {result.seconds:.1f} s · {date(result.started_at)}"))
    return {"text": escape(title), "blocks": b.blocks}


# --- the Slack notifier ------------------------------------------------------------------------


class SlackAlerts:
    """Posts, updates and reminds alert messages in one channel (implements ``Notifier``).

    ``people``: Linux user → Slack user ids; their idle holders are told in a direct message.
    """

    def __init__(
        self, api: SlackApi, channel: str, *, people: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self.api = api
        self.channel = channel
        self.people = people or {}
        self._dms: dict[str, str] = {}  # Slack user id → their direct message's channel id

    async def post(self, group: AlertGroup) -> Handle | None:
        """Post a new alert message; return where it is (then DM the idle holders' owners)."""
        where = await self.api.post(self.channel, render_alert_group(group))
        if where is not None:  # once per finding: the DM rides on the alert it belongs to
            try:
                await self.direct(group, where)
            except Exception:  # a courtesy message never fails a sweep
                log.exception("direct messages about idle GPUs on %s failed", group.node)
        return where

    async def direct(self, group: AlertGroup, where: Handle | None) -> int:
        """DM each owner of the group's open idle holders who maps to Slack; return DMs sent."""
        mine: dict[str, list[AlertItem]] = {}
        for item in group.open:
            f = item.finding
            if f is None or f.kind is not FindingKind.IDLE_HOLDER or f.owner is None:
                continue
            for user in self.people.get(f.owner, ()):
                mine.setdefault(user, []).append(item)
        sent = 0
        for user, items in mine.items():
            channel = self._dms.get(user) or await self.api.open_dm(user)
            if channel is None:
                continue
            self._dms[user] = channel
            msg = render_idle_dm(items, group.node, now=group.at, alert=where,
                                 snooze=lambda key: snooze_buttons(key)[-1])  # fmt: skip
            if await self.api.post(channel, msg) is not None:
                sent += 1
        return sent

    async def update(self, where: Handle, group: AlertGroup) -> None:
        """Replace an alert message by the group's current state."""
        await self.api.update(where, render_alert_group(group))

    async def remind(self, where: Handle, group: AlertGroup) -> None:
        """Post a reminder in the alert's thread, shown in the channel too."""
        msg = render_reminder(group)
        try:
            await self.api.client.chat_postMessage(
                channel=where[0], thread_ts=where[1], reply_broadcast=True, **msg
            )
        except (SlackApiError, SlackClientError) as exc:
            err = exc.response.get("error") if isinstance(exc, SlackApiError) else repr(exc)
            log.error("reminder in %s/%s failed: %s", where[0], where[1], err)


# --- buttons and /gpu sweep --------------------------------------------------------------------


def register_snooze(bot: GpuBot, service: SweepService) -> None:
    """Handle the snooze buttons of alert messages in ``bot``."""

    async def on_snooze(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        m = SNOOZE_ACTION.match(str(action.get("action_id")))
        if m is None:
            return
        user = (body.get("user") or {}).get("id", "")
        bot.spawn(_snooze(bot, service, body, str(action.get("value")), m[1], str(user)),
                  f"snooze {m[1]}")  # fmt: skip

    bot.app.action(SNOOZE_ACTION)(on_snooze)


async def _snooze(
    bot: GpuBot, service: SweepService, body: dict[str, Any], key: str, choice: str, user: str
) -> None:
    out = bot.surface(body)
    try:
        alert = await service.snooze(key, choice, by=f"slack:{user}")
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    until = alert.snoozed_until or datetime.now(UTC)
    where = f"{alert.key.node} GPU {alert.key.gpu}" if alert.key.gpu is not None else alert.key.node
    text = f"🔕 {escape(where)}: {escape(alert.key.kind)} snoozed until {date(until.timestamp())}"
    await out.reply({"text": text, "blocks": [section(text)]})


def chat_sweeper(service: SweepService) -> Sweeper:
    """Return what ``/gpu sweep`` runs: a read-only sweep now, rendered."""

    async def sweep(who: Identity) -> Message:
        result = await service.run(alerting=False, source="slack", actor=f"slack:{who.id}")
        return render_sweep(result)

    return sweep


# --- wiring into gpubot serve -------------------------------------------------------------------


@dataclass
class Sweeps:
    """Everything ``start_sweeps`` started; ``stop()`` stops it."""

    config: SweepConfig
    service: SweepService
    scheduler: SweepScheduler
    metrics: Metrics
    locks: DbLocks | None
    metrics_port: int | None  # the bound port, when metrics are served

    async def stop(self) -> None:
        """Stop the schedule (a sweep under way may finish), the metrics server, the locks."""
        await self.scheduler.stop()
        self.metrics.close()
        if self.locks is not None:
            self.locks.close()


async def start_sweeps(
    settings: Settings,
    app: App,
    bot: GpuBot | None,
    *,
    metrics_port: int | None = None,
    schedule: bool = True,
    first_after_s: float | None = None,
) -> Sweeps:
    """Start scheduled sweeps, Slack alerts, snooze buttons, ``/gpu sweep`` and the metrics.

    ``metrics_port`` (``--metrics-port``) overrides ``[metrics] port``; with neither, metrics
    are kept but not served. Raises ``ConfigError`` for bad settings or a busy port.
    """
    config = load_sweep_config(settings.extra, settings.path or "<settings>")
    port = config.metrics_port
    if metrics_port is not None:
        port = check_port(metrics_port, "--metrics-port")
    metrics = Metrics()
    bound = metrics.serve(port, config.metrics_host) if port is not None else None
    instrument_resets(app.reset, metrics)
    locks = DbLocks(app.store.engine) if app.store is not None else None
    notifier = None
    if bot is not None:
        channel = config.channel or bot.services.policy.channel
        if channel is None:
            log.warning("no [alerts] or [slack] channel: sweeps run, but nothing is posted")
        else:
            people = slack_users_of(bot.services.policy.users)
            notifier = SlackAlerts(bot.api, channel, people=people)
    service = SweepService(settings, config, app.status, app.store, notifier=notifier,
                           locks=locks, observer=metrics)  # fmt: skip
    if bot is not None:
        register_snooze(bot, service)
        register_free_it(bot, service)
        bot.services.sweep = chat_sweeper(service)
        bot.services.idle = service.idle_gpu_hours
    scheduler = SweepScheduler(service.scheduled, config.interval_s, first_after_s=first_after_s,
                               stop_wait_s=config.budget_s)  # fmt: skip
    if schedule:
        scheduler.start()
    if bound is not None:
        log.info("metrics at http://%s:%d/metrics", config.metrics_host, bound)
    return Sweeps(config, service, scheduler, metrics, locks, bound)
