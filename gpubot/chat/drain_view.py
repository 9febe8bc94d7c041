"""How a drain or resume through Slurm reads in chat: what changed (or why nothing did), the
reason gpubot wrote into Slurm and the audit record; and the request for approval of one asked
by someone who is no approver, with its buttons and its state once decided."""

from __future__ import annotations

from gpubot.chat.errors import error_message
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Date,
    Heading,
    Mention,
    Message,
    Part,
    Section,
    Sentence,
    Span,
    Style,
    Text,
    bold,
    ctx,
    note,
)
from gpubot.chat.reset_view import (
    ACTION_APPROVE,
    ACTION_DENY,
    STATE_LINE,
    Decision,
    state_line,
)
from gpubot.chat.tracking import Tracker
from gpubot.core.alerting import MessageRef
from gpubot.core.commands import MAX_REASON, Drain
from gpubot.core.slurm.drain import NodeChange
from gpubot.core.text import TICK, cut, one_line
from gpubot.errors import UsageError
from gpubot.services.drain import DrainResult
from gpubot.services.requests import Changed, Failed

ACTION_DRAIN_NODE = "gpubot_drain_node"  # an alert's Drain button; its value: "NODE REASON"


def drain_button(node: str, summary: str) -> Action:
    """Return the "Drain node" button of a finding whose next step is to drain: pressing it is
    ``/gpu drain NODE because SUMMARY`` by the presser, through the same approval."""
    reason = cut(" ".join(summary.replace(TICK, "").split()), MAX_REASON)
    ask = Confirm(
        f"Drain {node}?",
        f"Slurm will schedule no new job on {node} until it is resumed (on-call approves it "
        "unless you are on call).",
        confirm="Drain",
    )
    return Action(ACTION_DRAIN_NODE, "Drain node", f"{node} {reason}".strip(), confirm=ask)


def drain_of(value: str) -> Drain:
    """Return the drain a Drain button's value asks for (``UsageError`` if it names no node)."""
    node, _, reason = value.strip().partition(" ")
    if not node:
        raise UsageError("the Drain button names no node")
    return Drain(node, one_line(reason.strip())[:MAX_REASON] or None)


# Where a node change's request stands, where it differs from a forced kill's words.
CHANGE_LINE = {
    **STATE_LINE,
    "denied": "❌ Denied by {by} at {at}: nothing was changed in Slurm",
    "cancelled": "Cancelled by {by} at {at}: nothing was changed in Slurm",
}


def render_drain(result: DrainResult, who: str, *, approved_by: str | None = None) -> Message:
    """Render ``result`` of a drain or resume ``who`` (a chat id) asked for, approved by
    ``approved_by`` (None: ``who``'s own, as an approver)."""
    node, before = result.node, result.before
    named: list[Span] = [bold(node)]
    if result.slurm_node != node:
        named += [" (Slurm's ", Code(result.slurm_node), ")"]
    if not result.changed:
        now = "drained already" if result.drain else "in service already"
        spans: list[Span] = ["ℹ ", *named, f" is {now} (", Code(before.shown())]
        if before.reason:
            spans += [", reason ", Code(before.reason)]
        spans += ["): nothing was changed"]
        title = f"{result.verb.capitalize()} {node} · unchanged"
    else:
        after = "?" if result.after is None else result.after.shown()
        verb = "drained" if result.drain else "returned to service"
        spans = ["✅ Slurm ", verb, " ", *named, ": ", Code(before.shown()), " → ", Code(after)]
        if result.reason:
            spans += [". Reason in Slurm: ", Code(result.reason)]
        title = f"{result.verb.capitalize()} {node} · done"
    if not result.drain and result.changed:  # offered: a drained GPU is tested before use
        test = Code(f"/gpu diag {node} gpu N")
        spans += [". Before it takes jobs again, test a GPU that was at fault: ", test]
    msg = note(*spans, title=title, fallback=f"{title} (audit #{result.action_id})")
    audit = f" · audit #{result.action_id}"
    if approved_by is None or approved_by == who:
        by = ctx(("Requested and approved by ", Mention(who), audit))
    else:
        by = ctx(("Requested by ", Mention(who), ", approved by ", Mention(approved_by), audit))
    return Message(msg.title, (*msg.body, by), msg.fallback)


def change_title(change: NodeChange) -> str:
    """Return "drain of node1" / "resume of node1"."""
    return f"{change.verb} of {change.node}"


def _change_text(change: NodeChange, requester_id: str, requester_user: str | None) -> Text:
    who = requester_user or "no known Linux user"
    if change.drain:
        out: list[Span] = [Mention(requester_id), f" ({who}) asks to drain ", bold(change.node)]
        out.append(" in Slurm: Slurm schedules no new job on it until it is resumed.")
        # typed by the requester: a plain string, escaped by each renderer
        out += [" Reason: “", change.reason or "no reason given", "”."]
    else:
        out = [Mention(requester_id), f" ({who}) asks to return ", bold(change.node)]
        out.append(" to service in Slurm (resume).")
    return tuple(out)


def render_change_request(
    approval_id: int,
    change: NodeChange,
    requester_id: str,
    requester_user: str | None,
    expires_at: float,
    *,
    context: Text = (),
) -> Message:
    """Render a drain or resume waiting for on-call approval, with Approve / Deny buttons (the
    same as a forced kill's: one approval mechanism)."""
    parts: list[Part] = [
        Heading(f"Approval needed · {change_title(change)}"),
        Section(_change_text(change, requester_id, requester_user)),
    ]
    if context:
        parts.append(Section(context))
    when = ctx(f"Request #{approval_id}", ("expires ", Date(expires_at)))
    if change.drain:
        ask = Confirm(
            f"Drain {change.node}?",
            f"Slurm will schedule no new job on {change.node} until it is resumed.",
            confirm="Drain",
        )
    else:
        ask = Confirm(
            f"Resume {change.node}?",
            f"Slurm will schedule jobs on {change.node} again.",
            confirm="Resume",
            style=Style.PRIMARY,
        )
    approve = Action(ACTION_APPROVE, "Approve", str(approval_id), Style.PRIMARY, ask)
    deny = Action(ACTION_DENY, "Deny", str(approval_id), Style.DANGER)
    buttons = Actions((approve, deny), group=f"gpubot_approval_{approval_id}")
    text = f"Approval needed (#{approval_id}): {change_title(change)} in Slurm"
    return Message(None, (*parts, when, buttons), text)


def render_change_state(
    approval_id: int,
    change: NodeChange,
    requester_id: str,
    requester_user: str | None,
    decision: Decision,
    *,
    body: Message | None = None,
    note: str | None = None,
) -> Message:
    """Render a node change's request once decided, or waiting (no buttons): who decided and
    when, then what Slurm did (``body``)."""
    line = state_line(decision.state, decision.by, decision.at, table=CHANGE_LINE)
    title = change_title(change)
    parts: list[Part] = [
        Heading(f"{title[0].upper()}{title[1:]} · request #{approval_id}"),
        Section(_change_text(change, requester_id, requester_user)),
        Section((*line, NL, Sentence(note)) if note else line),
    ]
    rest = () if body is None else body.body  # ours replaces the body's own title
    return Message(
        None, (*parts, *rest), f"Request #{approval_id} on {change.node}: {decision.state}"
    )


async def show_change(
    track: Tracker, outcome: Changed | Failed, waiting: dict[int, MessageRef | None]
) -> None:
    """Show how an approved drain or resume ended, on its request and on the requester's
    message (``waiting``: each approval's, taken once shown)."""
    a = outcome.approval
    if isinstance(outcome, Changed):
        asked, by = ("?", None) if a is None else (a.requester, a.decided_by)
        body = render_drain(outcome.result, asked, approved_by=by)
    else:
        body = error_message(outcome.error)
    track.handle = await track.out.update(track.handle, track.frame(body))
    mine = None if a is None else waiting.pop(a.id, None)
    if mine is not None:
        await track.out.update(mine, track.frame(body))
