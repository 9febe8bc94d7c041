"""Sweep alerts and reports, as messages: one message per node's findings, reminders, resolution,
the snooze buttons, and ``/gpu sweep``'s report (pure ``render_*``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import datetime

from gpubot.chat.drain_view import drain_button
from gpubot.chat.fleet_view import add_gpus
from gpubot.chat.flows import Sweeper
from gpubot.chat.interrupted import sweep_lines
from gpubot.chat.layout import MAX_FALLBACK, Budget, clip
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Date,
    DateStyle,
    Heading,
    Message,
    Section,
    Sentence,
    Span,
    Struck,
    Text,
    bold,
    clipped,
    ctx,
    italic,
    lines,
)
from gpubot.chat.reset_view import reset_button
from gpubot.core import durations
from gpubot.core.alerting import SNOOZE_S, AlertGroup, AlertItem, SweepResult
from gpubot.core.health.codes import RESET_WHEN_IDLE
from gpubot.core.health.kinds import BY_NAME, title_of
from gpubot.core.policy import Person
from gpubot.core.reset.interrupted import Unfinished
from gpubot.errors import DUTY_TURN, GpubotError
from gpubot.services.sweep import SweepService

log = logging.getLogger(__name__)

ACTION_SNOOZE = "gpubot_snooze_"  # + how long ("1h"); the value is the finding's key text
SNOOZE_ACTION = re.compile(r"^gpubot_snooze_(\w+)$")  # how long: ``snooze_until`` judges it
MAX_ITEMS = 12  # findings detailed in one message (3 blocks each); the rest are counted


def item_place(item: AlertItem, group: AlertGroup) -> str:
    """Return what a finding is about: its GPU, or in a digest its node (and GPU)."""
    gpu = "" if item.key.gpu is None else f"GPU {item.key.gpu}"
    if item.key.node == group.node:
        return gpu or "node"
    return f"{item.key.node} {gpu}".rstrip()


def _about(item: AlertItem, group: AlertGroup) -> str:
    return f"{item_place(item, group)}: {title_of(item.key.kind)}"


def _summary(item: AlertItem) -> str:
    if item.finding is not None:
        return item.finding.summary
    pid = item.key.holder.split(":", 1)[0]
    return f"pid {pid}" if pid else ""


def snooze_buttons(key_text: str) -> list[Action]:
    """Return the "Snooze 1 h" / "Snooze 1 day" buttons of one finding."""
    return [
        Action(f"{ACTION_SNOOZE}{durations.format(seconds)}", label, key_text)
        for seconds, label in zip(SNOOZE_S, ("Snooze 1 h", "Snooze 1 day"), strict=True)
    ]


def _item_text(item: AlertItem, group: AlertGroup) -> Text:
    now = group.at
    # Each part is clipped, so that the state line always fits the section's 3000 characters.
    summary = _summary(item)  # a core sentence: its names marked (core.text.code)
    if item.resolved_at is not None:
        lasted = durations.format((item.resolved_at - item.first_seen).total_seconds(), "people")
        gone = Struck((_about(item, group),))
        said: list[Text] = [("✅ ", gone, " — ", bold("resolved"), f" after {lasted}")]
    else:
        said = [("⚠ ", bold(_about(item, group)))]
    if summary:  # not in our italics: those would style a name's words too
        said.append((clipped(600, Sentence(summary)),))
    if item.resolved_at is not None:
        return lines(*said)
    if item.finding is not None and item.finding.owner:
        said.append(("owner: ", clipped(200, Code(item.finding.owner))))
    if item.readiness is not None:
        ready = [("• ", clipped(250, Sentence(line))) for line in item.readiness.lines()]
        said.append((italic("before a GPU reset:"), NL, *lines(*ready)))
    state: list[Span] = ["first seen ", Date(item.first_seen.timestamp())]
    if item.snoozed_until is not None and item.snoozed_until > now:
        state += [" · 🔕 snoozed until ", Date(item.snoozed_until.timestamp())]
    said.append(tuple(state))
    return lines(*said)


def _actions(item: AlertItem, group: AlertGroup) -> Actions | None:
    if item.resolved_at is not None:
        return None
    elements = []
    f = item.finding
    offered = f is not None and f.next_step == RESET_WHEN_IDLE
    kind = BY_NAME.get(item.key.kind)
    if item.key.gpu is not None and ((kind is not None and kind.reset) or offered):
        elements.append(reset_button(item.key.node, item.key.gpu))
    if f is not None and (f.drain or f.kind.drain) and f.node in group.slurm_nodes:
        elements.append(drain_button(f.node, f.summary))
    elements += snooze_buttons(item.key.text())
    return Actions(tuple(elements))


def group_title(group: AlertGroup) -> str:
    """Return the title of an alert message: its name and how many findings are open."""
    open_n, total = len(group.open), len(group.items)
    if open_n == 0:
        return f"✅ {group.node}: resolved"
    if open_n == total:
        return f"⚠ {group.node}: {total} finding{'s' if total != 1 else ''}"
    return f"⚠ {group.node}: {open_n} of {total} findings open"


def item_parts(item: AlertItem, group: AlertGroup) -> tuple[Section, Actions | None]:
    """Return one finding's section and its buttons (None once it is resolved)."""
    return Section(_item_text(item, group)), _actions(item, group)


def item_line(item: AlertItem, group: AlertGroup) -> str:
    """Return one finding in a few words ("node3 GPU 2 orphaned GPU memory (resolved)")."""
    done = " (resolved)" if item.resolved_at else ""
    return f"{item_place(item, group)} {title_of(item.key.kind)}{done}"


def group_fallback(group: AlertGroup, title: str) -> str:
    """Return an alert message's fallback line: its title, then each finding in a few words."""
    again = " (this may repeat an earlier alert)" if group.repeat_of is not None else ""
    parts = [item_line(i, group) for i in group.items]
    return clip(f"{title}{again}: " + "; ".join(parts), MAX_FALLBACK)


def render_alert_group(group: AlertGroup) -> Message:
    """Render the alert message of one node's findings, as they stand now."""
    now = group.at
    total = len(group.items)
    title = group_title(group)
    b = Budget()
    b.add(Heading(title))
    reserve = 3 + (group.repeat_of is not None)  # table, "more not shown", context line(s)
    shown = 0
    for item in group.items[:MAX_ITEMS]:
        acts = _actions(item, group)
        if b.room <= reserve + (2 if acts else 1):
            break
        b.add(Section(_item_text(item, group)))
        if acts is not None:
            b.add(acts)
        shown += 1
    if shown < total:
        b.add(ctx(f"… and {total - shown} more finding(s) on {group.node}"))
    snap = group.snapshot
    if snap is not None and snap.gpus:
        add_gpus(b, snap)
    if group.repeat_of is not None:  # the outbox could not tell whether that one landed
        b.add(ctx(repeat_line(group.repeat_of)))
    b.add(ctx(("gpubot sweep · ", Date(now.timestamp()))))
    return b.message(group_fallback(group, title))


def repeat_line(earlier: datetime) -> Text:
    """Return the line of an alert that may repeat one posted at ``earlier`` (HH:MM)."""
    return (
        "⚠ this may repeat the alert of ",
        Date(earlier.timestamp(), DateStyle.TIME),
        ": gpubot could not read the channel's history to check whether that one was posted",
    )


def render_reminder(group: AlertGroup) -> Message:
    """Render a reminder of findings that persist (posted in the alert's thread)."""
    now = group.at
    said: list[Text] = [("⏰ ", bold(f"Still open on {group.node}:"))]
    for item in group.items[:40]:
        lasted = durations.format((now - item.first_seen).total_seconds(), "people")
        said.append((f"• {_about(item, group)} — open for {lasted}",))
    more = len(group.items) - min(len(group.items), 40)
    if more:
        said.append((f"… and {more} more",))
    fallback = clip(f"Still open on {group.node}", MAX_FALLBACK)
    return Message(None, (Section(lines(*said)),), fallback)


def render_sweep(result: SweepResult, interrupted: Sequence[Unfinished] = ()) -> Message:
    """Render ``/gpu sweep``'s report; ``interrupted``: its nodes' unreviewed interruptions."""
    if result.skipped:
        skipped = f"Sweep skipped: {result.skipped}"
        return Message(None, (Section((skipped,)),), skipped)
    n, bad, found = len(result.nodes), len(result.failed), len(result.findings)
    title = f"Sweep: {n} node(s), {bad} failing, {found} finding(s)"
    b = Budget()
    b.add(Heading(title))
    if not result.findings:
        b.add(Section(("✅ No zombie processes, orphaned memory or failing nodes found.",)))
    detail: list[str] = []
    for f in result.findings:
        where = f"{f.node} GPU {f.gpu}" if f.gpu is not None else f.node
        detail.append(f"{where}: {f.kind.value}: {f.summary}")
        ready = result.readiness.get((f.node, f.gpu)) if f.gpu is not None else None
        if ready is not None:
            detail += [f"    {line}" for line in ready.lines()]
    if detail:
        done = b.add_pre(detail, reserve=2)
        if done < len(detail):
            more = f"… {len(detail) - done} more lines: "
            b.add(ctx((more, Code("gpubot sweep"), " shows all")))
    idle = result.idle_gpu_hours
    if idle:
        held = " · ".join(f"{u} {h:.1f}" for u, h in list(idle.items())[:20])
        b.add(ctx(f"GPU-hours held idle: {held}"))
    if interrupted:
        head = ("⚠ ", bold(f"{len(interrupted)} interrupted action(s)"), " never finished:")
        b.add(Section(lines(head, *sweep_lines(interrupted))))
    asked = f"{n} node(s) asked in {result.seconds:.1f} s · "
    b.add(ctx((asked, Date(result.started_at))))
    return b.message(title)


def chat_sweeper(service: SweepService) -> Sweeper:
    """Return what ``/gpu sweep`` runs: a read-only sweep now, rendered and audited."""

    async def sweep(who: Person, source: str) -> Message:
        actor = who.id if who.id.startswith(f"{source}:") else f"{source}:{who.id}"
        result = await service.run(alerting=False, source=source, actor=actor)
        found: Sequence[Unfinished] = ()
        if service.audit is not None and not result.skipped:
            try:
                found = await service.audit.interrupted(result.nodes)
            except GpubotError as exc:  # the report still shows what the sweep found
                log.warning(
                    "interrupted actions not listed in the sweep report: %s", exc, extra=DUTY_TURN
                )
        return render_sweep(result, found)

    return sweep
