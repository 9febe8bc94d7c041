"""Block Kit messages for resets, approvals, alerts and the audit log (pure ``render_*``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpubot.chat.blocks import (
    MAX_TABLE_ROWS,
    Budget,
    Message,
    clip,
    clip_mrkdwn,
    code,
    code_safe,
    confirm_dialog,
    context,
    date,
    escape,
    header,
    mrkdwn,
    section,
    table,
    table_fits,
)
from gpubot.core.models import NodeSnapshot, Outcome
from gpubot.core.plan import ResetPlan
from gpubot.core.stopgate import plan_stop_notes

if TYPE_CHECKING:
    from gpubot.services.reset import ResetEvent, ResetResult

ACTION_APPROVE = "gpubot_approve"
ACTION_DENY = "gpubot_deny"
ACTION_RESET_GPU = "gpubot_reset_gpu"
MARK = {Outcome.FREED: "✅", Outcome.UNKNOWN: "❔"}


def _gpus(gpus: Sequence[int]) -> str:
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
                _gpus(t.gpus),
                "?" if t.mib is None else str(t.mib),
                clip(t.command, 60),
                clip("; ".join(t.reasons), 120),
            ]
        )
    return rows


def plan_lines(plan: ResetPlan) -> list[str]:
    """Return a plan as preformatted lines (escaped)."""
    lines = [
        code_safe(
            f"kill  {t.user or '?'} {t.pid} {_mib(t.mib)} GPU {_gpus(t.gpus)}  "
            f"{clip(t.command, 50)}  ({'; '.join(t.reasons)})"
        )
        for t in plan.targets
    ]
    lines += [
        code_safe(f"leave {s.user or '?'} {s.pid} GPU {s.gpu}  {clip(s.command, 40)}: {s.reason}")
        for s in plan.skipped
    ]
    return lines or ["no process to signal"]


def _add_plan(b: Budget, plan: ResetPlan, *, use_table: bool, reserve: int) -> None:
    rows = plan_rows(plan)
    if use_table and plan.targets and table_fits(rows):
        b.add(table(rows, wrap=(4, 5), right=(0, 3)))
        if plan.skipped:
            left = "; ".join(
                f"{s.user or '?'} {s.pid} on GPU {s.gpu}: {s.reason}" for s in plan.skipped[:5]
            )
            more = f" (+{len(plan.skipped) - 5} more)" if len(plan.skipped) > 5 else ""
            b.add(context(escape(f"Left alone: {left}{more}")))
        return
    lines = plan_lines(plan)
    shown = b.add_pre(lines, reserve=reserve + 1)
    if shown < len(lines):
        b.add(context(f"… {len(lines) - shown} more line(s) of the plan not shown"))


def step_lines(events: Sequence[ResetEvent]) -> list[str]:
    """Summarise reset events: planned → signals → exits → verifying → outcome per GPU."""
    lines: list[str] = []
    kinds: list[str] = [e.kind for e in events]
    for e in events:
        if e.kind == "planned":
            n = len(e.data.get("targets", []))
            lines.append(f"✓ planned: {n} process(es) on GPU {_gpus(e.data.get('gpus', []))}")
    for sig in ("SIGTERM", "SIGKILL"):
        sent = [e for e in events if e.kind == "signal" and e.data.get("signal") == sig]
        if sent:
            counts: dict[str, int] = {}
            for e in sent:
                counts[str(e.data.get("result"))] = counts.get(str(e.data.get("result")), 0) + 1
            lines.append(f"✓ {sig}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    exited = kinds.count("exited")
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
            lines.append(f"⏳ verifying GPU {_gpus(pending)} …")
    for o in outcomes:
        lines.append(_outcome_line(o.data))
    if not lines:
        lines.append("⏳ planning …")
    return [mrkdwn(line) for line in lines]  # outcome details are core sentences


def _outcome_line(d: Mapping[str, Any]) -> str:
    outcome = Outcome(d["outcome"])
    took = d.get("seconds_to_free")
    when = f" in {took:.1f} s" if isinstance(took, int | float) else ""
    return f"{MARK.get(outcome, '⚠')} GPU {d.get('index')}: {outcome}{when} — {d.get('detail')}"


def render_progress(
    title: str, who: str, plan: ResetPlan | None, events: Sequence[ResetEvent]
) -> Message:
    """Render a reset in progress; ``who`` is mrkdwn (e.g. ``Requested by <@U1>``)."""
    b = Budget()
    b.add(header(title))
    b.add(section(who))
    if plan is not None:
        _add_plan(b, plan, use_table=True, reserve=2)
    b.add(section("\n".join(step_lines(events))))
    b.add(context("in progress …"))
    return {"text": escape(f"{title}: in progress"), "blocks": b.blocks}


def _users_on(snap: NodeSnapshot | None, gpu: int) -> str:
    if snap is None:
        return ""
    users = sorted({p.user or "?" for p in snap.on_gpu(gpu)})
    return f" · {', '.join(users)}" if users else ""


def result_rows(result: ResetResult) -> list[list[str]]:
    """Return before/after rows: GPU, memory and users before and after, outcome, time."""
    rows = [["GPU", "Before", "After", "Outcome", "Freed in"]]
    for g in result.gpus:
        took = "–" if g.seconds_to_free is None else f"{g.seconds_to_free:.1f} s"
        rows.append(
            [
                str(g.index),
                _mib(g.memory_before_mib) + _users_on(result.before, g.index),
                _mib(g.memory_after_mib) + _users_on(result.after, g.index),
                f"{MARK.get(g.outcome, '⚠')} {g.outcome}",
                took,
            ]
        )
    return rows


def render_result(title: str, who: str, result: ResetResult, *, use_table: bool = True) -> Message:
    """Render a finished reset: before/after per GPU, the outcome and how long freeing took."""
    verdict = "freed" if result.ok else "NOT all freed"
    b = Budget()
    b.add(header(f"{title} · {verdict}"))
    b.add(section(who))
    rows = result_rows(result)
    if use_table and table_fits(rows):
        b.add(table(rows, wrap=(1, 2), right=(0, 4)))
    else:
        b.add_pre([code_safe(r) for r in _aligned(rows)], reserve=4)
    problems = [g for g in result.gpus if g.outcome is not Outcome.FREED]
    if problems:
        text = "\n".join(
            "• " + mrkdwn(f"GPU {g.index}: {g.outcome} — {g.detail}") for g in problems
        )
        b.add(section(text))
    killed = ", ".join(f"{t.user or '?'} {t.pid}" for t in result.plan.targets[:10])
    more = f" (+{len(result.plan.targets) - 10})" if len(result.plan.targets) > 10 else ""
    audit = f"audit #{result.action_id}" if result.action_id is not None else "not audited"
    b.add(context(escape(f"signalled: {killed or 'none'}{more}"), audit))
    fallback = f"{title}: {verdict} — " + "; ".join(
        f"GPU {g.index} {g.outcome}" for g in result.gpus[:20]
    )
    return {"text": escape(clip(fallback, 3000)), "blocks": b.blocks}


def _aligned(rows: list[list[str]]) -> list[str]:
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def _request_text(plan: ResetPlan, requester_id: str, requester_user: str | None) -> str:
    who = escape(requester_user) if requester_user else "no known Linux user"
    # Owners are names a node's user database gives: code spans, never inside our own bold.
    owners = ", ".join(code(o) for o in plan.owners)
    kills = "; ".join(plan.workloads[:5]) + ("; …" if len(plan.workloads) > 5 else "")
    return (
        f"<@{requester_id}> ({who}) asks to free *{escape(plan.node)}* GPU {_gpus(plan.gpus)}. "
        f"This kills processes of {owners}: {len(plan.targets)} process(es), "
        f"{plan.total_mib} MiB."
        + (f" It kills {clip_mrkdwn(mrkdwn(kills), 1500)}." if kills else "")
        + "".join(f" {clip_mrkdwn(mrkdwn(n), 500)}." for n in plan_stop_notes(plan)[:3])
    )


def render_approval_request(
    approval_id: int,
    plan: ResetPlan,
    requester_id: str,
    requester_user: str | None,
    expires_at: float,
) -> Message:
    """Render a forced kill waiting for on-call approval, with Approve / Deny buttons."""
    b = Budget()
    b.add(header(f"Approval needed · forced kill on {plan.node}"))
    b.add(section(_request_text(plan, requester_id, requester_user)))
    _add_plan(b, plan, use_table=True, reserve=2)
    b.add(context(f"Request #{approval_id}", f"expires {date(expires_at)}"))
    gpus = _gpus(plan.gpus)
    b.blocks.append(
        {
            "type": "actions",
            "block_id": f"gpubot_approval_{approval_id}",
            "elements": [
                {
                    "type": "button",
                    "action_id": ACTION_APPROVE,
                    "value": str(approval_id),
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    # plain_text throughout, raw (not escaped): see blocks.confirm_dialog
                    "confirm": confirm_dialog(
                        "Approve the forced kill?",
                        f"{len(plan.targets)} process(es) of {', '.join(plan.owners)} on "
                        f"{plan.node} GPU {gpus} will be killed.",
                        confirm="Kill them",
                        deny="Cancel",
                        style="danger",
                    ),
                },
                {
                    "type": "button",
                    "action_id": ACTION_DENY,
                    "value": str(approval_id),
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Deny"},
                },
            ],
        }
    )
    text = (
        f"Approval needed (#{approval_id}): forced kill of {', '.join(plan.owners)}'s processes "
        f"on {plan.node} GPU {gpus}"
    )
    return {"text": escape(clip(text, 3000)), "blocks": b.blocks}  # many owners: clipped


STATE_LINE = {
    "pending": "⏳ Waiting for an on-call approver (expires {at})",
    "approved": "✅ Approved by {by} at {at}",
    "denied": "❌ Denied by {by} at {at}: nothing was killed",
    "expired": "⌛ Expired at {at}: nothing was killed",
    "cancelled": "Cancelled by {by} at {at}: nothing was killed",
    "executed": "✅ Approved by {by} at {at}",
    "failed": "✅ Approved by {by} at {at}",
}


def render_approval_state(
    approval_id: int,
    plan: ResetPlan,
    requester_id: str,
    requester_user: str | None,
    *,
    state: str,
    by: str | None,
    at: float | None,
    body: Message | None = None,
    note: str | None = None,
) -> Message:
    """Render a decided request (no buttons): who decided and when, then progress or result."""
    line = STATE_LINE.get(state, state).format(
        by=f"<@{by}>" if by else "?", at=date(at) if at else ""
    )
    b = Budget()
    b.add(header(f"Forced kill on {plan.node} · request #{approval_id}"))
    b.add(section(_request_text(plan, requester_id, requester_user)))
    b.add(section(line + (f"\n{mrkdwn(note)}" if note else "")))
    if body is None:
        _add_plan(b, plan, use_table=True, reserve=1)
    else:
        blocks = body["blocks"]
        if blocks and blocks[0].get("type") == "header":  # ours replaces the body's own header
            blocks = blocks[1:]
        for blk in blocks:
            b.add(blk)
    return {"text": escape(f"Request #{approval_id} on {plan.node}: {state}"), "blocks": b.blocks}


def reset_button(node: str, gpu: int) -> dict[str, Any]:
    """Return the "Reset GPU N" button alerts carry (starts the plan → approval flow)."""
    return {
        "type": "button",
        "action_id": ACTION_RESET_GPU,
        "value": f"{node}:{gpu}",
        "text": {"type": "plain_text", "text": f"Reset GPU {gpu}"},
    }


def render_alert(node: str, gpu: int | None, title: str, detail: str, *, at: float) -> Message:
    """Render a sweep alert; one about a GPU carries a "Reset GPU N" button."""
    where = f"{node} GPU {gpu}" if gpu is not None else node
    blocks = [
        section(f"⚠ *{escape(where)}: {escape(title)}*\n{mrkdwn(detail)}"),
        context(f"found {date(at)}"),
    ]
    if gpu is not None:
        blocks.append({"type": "actions", "elements": [reset_button(node, gpu)]})
    return {"text": escape(clip(f"{where}: {title} — {detail}", 3000)), "blocks": blocks}


def render_audit(actions: Sequence[Any], *, node: str | None = None) -> Message:
    """Render action summaries (newest first): id, when, who, what, node, GPUs, status."""
    title = f"Audit log · {node}" if node else "Audit log"
    b = Budget()
    b.add(header(title))
    if not actions:
        b.add(section("_no actions recorded_"))
        return {"text": f"{title}: no actions", "blocks": b.blocks}
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
                _gpus(a.gpus),
                a.status,
            ]
        )
    if table_fits(rows):
        b.add(table(rows, wrap=(3,), right=(0,)))
    else:
        b.add_pre([code_safe(r) for r in _aligned(rows)], reserve=1)
    b.add(context(f"{len(rows) - 1} action(s) · `gpubot audit show ID` for details"))
    return {"text": f"{title}: {len(rows) - 1} action(s)", "blocks": b.blocks}
