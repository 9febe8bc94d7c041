"""Messages for resets, approvals, alerts and the audit log (pure ``render_*``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpubot.chat.layout import MAX_TABLE_ROWS, Budget, clip, rows_of, table_fits, table_text
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Date,
    DateStyle,
    Heading,
    Mention,
    Message,
    Section,
    Sentence,
    Span,
    Style,
    Table,
    Text,
    bold,
    clipped,
    ctx,
    italic,
    joined,
    lines,
)
from gpubot.core.models import NodeSnapshot, Outcome
from gpubot.core.reset.outcome import outcome_words
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.reset.stopgate import plan_stop_notes

if TYPE_CHECKING:
    from gpubot.services.reset import ResetEvent, ResetResult

ACTION_APPROVE = "gpubot_approve"
ACTION_DENY = "gpubot_deny"
ACTION_RESET_GPU = "gpubot_reset_gpu"
MARK = {Outcome.FREED: "✅", Outcome.UNKNOWN: "❔"}


def gpu_list(gpus: Sequence[int]) -> str:
    """Return GPU indexes as words ("0, 2"; "–" for none)."""
    return ", ".join(map(str, gpus)) or "–"


def _mib(v: int | None) -> str:
    return "?" if v is None else f"{v} MiB"


def plan_rows(plan: ResetPlan) -> list[list[str]]:
    """Return the table rows of a plan's targets: header, then one row per process."""
    rows = [["PID", "User", "GPU", "MiB", "Command", "Why"]]
    for t in plan.targets:
        rows.append(
            [
                str(t.pid),
                t.user or "?",
                gpu_list(t.gpus),
                "?" if t.mib is None else str(t.mib),
                clip(t.command, 60),
                clip("; ".join(t.reasons), 120),
            ]
        )
    return rows


def plan_lines(plan: ResetPlan) -> list[str]:
    """Return a plan as preformatted lines."""
    out = [
        f"kill  {t.user or '?'} {t.pid} {_mib(t.mib)} GPU {gpu_list(t.gpus)}  "
        f"{clip(t.command, 50)}  ({'; '.join(t.reasons)})"
        for t in plan.targets
    ]
    out += [
        f"leave {s.user or '?'} {s.pid} GPU {s.gpu}  {clip(s.command, 40)}: {s.reason}"
        for s in plan.skipped
    ]
    return out or ["no process to signal"]


def _add_plan(b: Budget, plan: ResetPlan, *, reserve: int) -> None:
    rows = plan_rows(plan)
    if plan.targets and table_fits(rows):
        b.add(Table(rows_of(rows), wrap=(4, 5), right=(0, 3)))
        if plan.skipped:
            left = "; ".join(
                f"{s.user or '?'} {s.pid} on GPU {s.gpu}: {s.reason}" for s in plan.skipped[:5]
            )
            more = f" (+{len(plan.skipped) - 5} more)" if len(plan.skipped) > 5 else ""
            b.add(ctx(f"Left alone: {left}{more}"))
        return
    found = plan_lines(plan)
    shown = b.add_pre(found, reserve=reserve + 1)
    if shown < len(found):
        b.add(ctx(f"… {len(found) - shown} more line(s) of the plan not shown"))


def step_lines(events: Sequence[ResetEvent]) -> list[Text]:
    """Summarise reset events: planned → signals → exits → verifying → outcome per GPU."""
    lines: list[str] = []
    for e in events:
        if e.kind == "planned":
            n = len(e.data.get("targets", []))
            lines.append(f"✓ planned: {n} process(es) on GPU {gpu_list(e.data.get('gpus', []))}")
    for sig in ("SIGTERM", "SIGKILL"):
        sent = Counter(
            str(e.data.get("result"))
            for e in events
            if e.kind == "signal" and e.data.get("signal") == sig
        )
        if sent:
            lines.append(f"✓ {sig}: " + ", ".join(f"{v} {k}" for k, v in sorted(sent.items())))
    exited = sum(e.kind == "exited" for e in events)
    if exited:
        lines.append(f"✓ exited: {exited} process(es)")
    for e in events:
        if e.kind == "gpu_reset":
            lines.append(
                f"✓ nvidia-smi --gpu-reset -i {e.data.get('gpu')}: exit {e.data.get('exit_status')}"
            )
    outcomes = [e for e in events if e.kind == "gpu_outcome"]
    verifying = next((e for e in events if e.kind == "verifying"), None)
    if verifying is not None:
        pending = [
            g
            for g in verifying.data.get("gpus", [])
            if not any(o.data.get("index") == g for o in outcomes)
        ]
        if pending:
            lines.append(f"⏳ verifying GPU {gpu_list(pending)} …")
    for o in outcomes:
        lines.append(_outcome_line(o.data))
    if not lines:
        lines.append("⏳ planning …")
    return [(Sentence(line),) for line in lines]  # outcome details are core sentences


def _outcome_line(d: Mapping[str, Any]) -> str:
    outcome = Outcome(d["outcome"])
    took = d.get("seconds_to_free")
    when = f" in {took:.1f} s" if isinstance(took, int | float) else ""
    return f"{MARK.get(outcome, '⚠')} GPU {d.get('index')}: {outcome}{when} — {d.get('detail')}"


def render_progress(
    title: str, who: Text, plan: ResetPlan | None, events: Sequence[ResetEvent]
) -> Message:
    """Render a reset in progress; ``who`` says who asked (e.g. ``Requested by`` a person)."""
    b = Budget()
    b.add(Heading(title))
    b.add(Section(who))
    if plan is not None:
        _add_plan(b, plan, reserve=2)
    b.add(Section(lines(*step_lines(events))))
    b.add(ctx("in progress …"))
    return b.message(f"{title}: in progress")


def _users_on(snap: NodeSnapshot | None, gpu: int) -> str:
    if snap is None:
        return ""
    users = sorted({p.user or "?" for p in snap.on_gpu(gpu)})
    return f" · {', '.join(users)}" if users else ""


def result_rows(result: ResetResult) -> list[list[str]]:
    """Return before/after rows: GPU, memory and users before and after, outcome, time."""
    rows = [["GPU", "Before", "After", "Outcome", "Freed in"]]
    signalled = {i for t in result.plan.targets for i in t.gpus}
    for g in result.gpus:
        took = "–" if g.seconds_to_free is None else f"{g.seconds_to_free:.1f} s"
        rows.append(
            [
                str(g.index),
                _mib(g.memory_before_mib) + _users_on(result.before, g.index),
                _mib(g.memory_after_mib) + _users_on(result.after, g.index),
                f"{MARK.get(g.outcome, '⚠')} {outcome_words(g, g.index in signalled)}",
                took,
            ]
        )
    return rows


def render_result(title: str, who: Text, result: ResetResult, *, use_table: bool = True) -> Message:
    """Render a finished reset: before/after per GPU, the outcome and how long freeing took."""
    verdict = "freed" if result.ok else "NOT all freed"
    b = Budget()
    b.add(Heading(f"{title} · {verdict}"))
    b.add(Section(who))
    rows = result_rows(result)
    if use_table and table_fits(rows):
        b.add(Table(rows_of(rows), wrap=(1, 2), right=(0, 4)))
    else:
        b.add_pre(table_text(rows), reserve=4)
    problems = [g for g in result.gpus if g.outcome is not Outcome.FREED]
    if problems:
        said = (("• ", Sentence(f"GPU {g.index}: {g.outcome} — {g.detail}")) for g in problems)
        b.add(Section(lines(*said)))
    killed = ", ".join(f"{t.user or '?'} {t.pid}" for t in result.plan.targets[:10])
    more = f" (+{len(result.plan.targets) - 10})" if len(result.plan.targets) > 10 else ""
    audit = f"audit #{result.action_id}" if result.action_id is not None else "not audited"
    b.add(ctx(f"signalled: {killed or 'none'}{more}", audit))
    for e in result.steps:
        if e.kind == "gpu_reset":  # offered, never run by itself
            b.add(Section((Sentence(diag_offer(result.node, e.data.get("gpu"))),)))
    fallback = f"{title}: {verdict} — " + "; ".join(
        f"GPU {g.index} {g.outcome}" for g in result.gpus[:20]
    )
    return b.message(clip(fallback, 3000))


def diag_offer(node: str, gpu: object) -> str:
    """Return the line offering DCGM's diagnostic after a GPU reset (a core sentence)."""
    return f"Run `/gpu diag {node} gpu {gpu}` before giving the GPU back."


def held_memory(plan: ResetPlan) -> str:
    """Return the memory the targets hold, in words: memory nobody could read is "unknown",
    never counted as 0 MiB (``≥ 3000 MiB + unknown``)."""
    known, unknown = plan.total_mib, plan.unknown_mib
    if not unknown:
        return f"{known} MiB"
    if unknown == len(plan.targets):
        return "memory unknown"
    return f"≥ {known} MiB + unknown"


def _request_text(plan: ResetPlan, requester_id: str, requester_user: str | None) -> Text:
    who = requester_user or "no known Linux user"
    # Owners are names a node's user database gives: code spans, never inside our own bold.
    owners = joined(Code(o) for o in plan.owners)
    kills = "; ".join(plan.workloads[:5]) + ("; …" if len(plan.workloads) > 5 else "")
    out: list[Span] = [Mention(requester_id), f" ({who}) asks to free ", bold(plan.node)]
    out += [f" GPU {gpu_list(plan.gpus)}. This kills processes of ", *owners]
    out.append(f": {len(plan.targets)} process(es), {held_memory(plan)}.")
    if plan.reason:  # typed by the requester: a plain string, escaped by each renderer
        out += [" Reason: “", plan.reason, "”."]
    if kills:
        out += [" It kills ", clipped(1500, Sentence(kills)), "."]
    for n in plan_stop_notes(plan)[:3]:
        out += [" ", clipped(500, Sentence(n)), "."]
    return tuple(out)


def render_approval_request(
    approval_id: int,
    plan: ResetPlan,
    requester_id: str,
    requester_user: str | None,
    expires_at: float,
    *,
    context: Text = (),
) -> Message:
    """Render a forced kill waiting for on-call approval, with Approve / Deny buttons
    (``context``: why it is asked)."""
    b = Budget()
    b.add(Heading(f"Approval needed · forced kill on {plan.node}"))
    b.add(Section(_request_text(plan, requester_id, requester_user)))
    if context:
        b.add(Section(context))
    _add_plan(b, plan, reserve=2)
    b.add(ctx(f"Request #{approval_id}", ("expires ", Date(expires_at))))
    gpus = gpu_list(plan.gpus)
    ask = Confirm(
        "Approve the forced kill?",
        f"{len(plan.targets)} process(es) of {', '.join(plan.owners)} on "
        f"{plan.node} GPU {gpus} will be killed.",
        confirm="Kill them",
    )
    approve = Action(ACTION_APPROVE, "Approve", str(approval_id), Style.PRIMARY, ask)
    deny = Action(ACTION_DENY, "Deny", str(approval_id), Style.DANGER)
    b.parts.append(Actions((approve, deny), group=f"gpubot_approval_{approval_id}"))
    text = (
        f"Approval needed (#{approval_id}): forced kill of {', '.join(plan.owners)}'s processes "
        f"on {plan.node} GPU {gpus}"
    )
    return b.message(clip(text, 3000))  # many owners: clipped


STATE_LINE = {
    "pending": "⏳ Waiting for an on-call approver (expires {at})",
    "approved": "✅ Approved by {by} at {at}",
    "denied": "❌ Denied by {by} at {at}: nothing was killed",
    "expired": "⌛ Expired at {time}, nobody decided; nothing was done",
    "cancelled": "Cancelled by {by} at {at}: nothing was killed",
    "executed": "✅ Approved by {by} at {at}",
    "failed": "✅ Approved by {by} at {at}",
    "incomplete": "✅ Approved by {by} at {at} · ⚠ interrupted: gpubot stopped while running it",
    "waiting": "✅ Approved by {by} at {at} · ⏳ not run yet: retried (see the thread)",
}


@dataclass(frozen=True)
class Decision:
    """Where a request stands: its state, who decided it and when (pending: when it expires)."""

    state: str
    by: str | None
    at: float | None


def render_approval_state(
    approval_id: int,
    plan: ResetPlan,
    requester_id: str,
    requester_user: str | None,
    decision: Decision,
    *,
    body: Message | None = None,
    note: str | None = None,
) -> Message:
    """Render a decided request (no buttons): who decided and when, then progress or result."""
    line = state_line(decision.state, decision.by, decision.at)
    b = Budget()
    b.add(Heading(f"Forced kill on {plan.node} · request #{approval_id}"))
    b.add(Section(_request_text(plan, requester_id, requester_user)))
    b.add(Section((*line, NL, Sentence(note)) if note else line))
    if body is None:
        _add_plan(b, plan, reserve=1)
    else:  # ours replaces the body's own title
        for part in body.body:
            b.add(part)
    return b.message(f"Request #{approval_id} on {plan.node}: {decision.state}")


_FIELD = re.compile(r"(\{by\}|\{at\}|\{time\})")


def state_line(
    state: str, by: str | None, at: float | None, *, table: Mapping[str, str] = STATE_LINE
) -> Text:
    """Return the line saying where a request stands: who decided it and when (``table``: the
    words of each state)."""
    out: list[Span] = []
    for piece in _FIELD.split(table.get(state, state)):
        if piece == "{by}":
            out.append(Mention(by) if by else "?")
        elif piece == "{at}":
            out += [Date(at)] if at else []
        elif piece == "{time}":  # hours and minutes
            out += [Date(at, DateStyle.TIME)] if at else []
        elif piece:
            out.append(piece)
    return tuple(out)


def reset_button(node: str, gpu: int) -> Action:
    """Return the "Reset GPU N" button alerts carry (starts the plan → approval flow)."""
    return Action(ACTION_RESET_GPU, f"Reset GPU {gpu}", f"{node}:{gpu}")


def render_audit(actions: Sequence[Any], *, node: str | None = None) -> Message:
    """Render action summaries (newest first): id, when, who, what, node, GPUs, status."""
    title = f"Audit log · {node}" if node else "Audit log"
    b = Budget()
    b.add(Heading(title))
    if not actions:
        b.add(Section((italic("no actions recorded"),)))
        return b.message(f"{title}: no actions")
    rows = [["#", "When (UTC)", "Who", "What", "Node", "GPUs", "Status"]]
    for a in actions[: MAX_TABLE_ROWS - 1]:
        when = (
            a.started_at.strftime("%m-%d %H:%M:%S")
            if isinstance(a.started_at, datetime)
            else str(a.started_at)
        )
        rows.append(
            [
                str(a.id),
                when,
                clip(f"{a.actor} ({a.source})", 40),
                clip(a.command, 60),
                a.node or "–",
                gpu_list(a.gpus),
                a.status,
            ]
        )
    if table_fits(rows):
        b.add(Table(rows_of(rows), wrap=(3,), right=(0,)))
    else:
        b.add_pre(table_text(rows), reserve=1)
    b.add(ctx((f"{len(rows) - 1} action(s) · ", Code("gpubot audit show ID"), " for details")))
    return b.message(f"{title}: {len(rows) - 1} action(s)")
