"""What the approval duty (``services.approval_duty``) says, as neutral messages.

An approved action that did not run to an end says so once, in its request's thread and to its
requester: interrupted, waiting to run, given up, run on a retry. Approved means run or told:
these are the "told".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from gpubot.chat.drain_view import change_title
from gpubot.chat.message import (
    NL,
    Code,
    Date,
    DateStyle,
    Mention,
    Message,
    Place,
    Section,
    Span,
    joined,
    note,
)
from gpubot.chat.message import ctx as context
from gpubot.chat.request_view import render_request
from gpubot.chat.reset_view import gpu_list
from gpubot.core.approval.model import Approval, run_until
from gpubot.core.approval.posts import Purpose
from gpubot.core.models import ApprovalState
from gpubot.core.reset.interrupted import show_command
from gpubot.core.slurm.drain import NodeChange
from gpubot.services.approvals import unix


def what(a: Approval) -> str:
    """Return "Request #ID (forced kill on NODE GPU N)" (a node change: "(drain of NODE)")."""
    return f"Request #{a.id} ({_asked(a)})"


def _asked(a: Approval) -> str:
    plan = a.plan
    if isinstance(plan, NodeChange):
        return change_title(plan)
    return f"forced kill on {a.node} GPU {gpu_list(plan.gpus)}"


def _again(a: Approval) -> str:
    """Return the command that asks for the same again."""
    plan = a.plan
    if isinstance(plan, NodeChange):
        return f"/gpu {plan.verb} {a.node}" + (f" because {plan.reason}" if plan.reason else "")
    return f"/gpu reset {a.node} gpu {','.join(map(str, plan.gpus))}"


def _why(a: Approval) -> str:
    found = a.result.get("error") if isinstance(a.result, dict) else None
    return str(found or "the reason was not recorded")


def _thread(a: Approval, mark: str, fallback: str, *text: Span) -> Message:
    """A word in the request's thread: which request, who asked and approved it, then ``text``."""
    who = ("asked by ", Mention(a.requester), ", approved by ", Mention(a.decided_by or "?"))
    said = (f"{mark} {what(a)}, ", *who, *text)
    return note(*said, fallback=f"Request #{a.id} on {a.node}: {fallback}")


def render_interrupted(a: Approval) -> Message:
    """In the thread: gpubot stopped while running it; it is marked incomplete, not run again."""
    why = (
        ", was interrupted: gpubot stopped while running it, and it is marked incomplete. "
        "It is not run again. Check the node; what it did is in the audit log: "
    )
    return _thread(a, "⚠", "interrupted", why, Code("gpubot audit list --incomplete"), ".")


def render_interrupted_dm(a: Approval) -> Message:
    """To the requester: their approved request was interrupted; check the node."""
    text: list[Span] = [
        f"⚠ Your {what(a)} was approved by ",
        Mention(a.decided_by or "?"),
        " but interrupted: gpubot stopped while running it. It is not run again: check ",
        Code(f"/gpu status {a.node}"),
        ", and ask again if it is still needed.",
    ]
    if a.ref is not None:
        text += [" The request: ", Place(a.ref), "."]
    return note(*text, fallback=f"Request #{a.id} on {a.node}: interrupted")


def render_waiting(a: Approval, valid_s: float) -> Message:
    """In the thread: approved, but it could not run yet; retried until its approval lapses."""
    why = f", could not run yet: {_why(a)}. Nothing was done; gpubot retries it until "
    until = (Date(run_until(a, valid_s).timestamp(), DateStyle.TIME), " and says here how it ends.")
    return _thread(a, "⏳", "waiting to run", why, *until)


def render_gave_up(a: Approval) -> Message:
    """In the thread: it never could run while approved; nothing was done."""
    why = f", never ran: {_why(a)}. Nothing was done. If it is still needed, ask again: "
    return _thread(a, "⚠", "never ran", why, Code(_again(a)), ".")


def render_retried(a: Approval) -> Message:
    """In the thread: a retry ran it; how it ended, and where its record is."""
    result = a.result if isinstance(a.result, dict) else {}
    action = result.get("action_id")
    if "error" in result:
        how = f"it failed: {result['error']}"
    elif isinstance(a.plan, NodeChange):
        how = "Slurm changed the node" if result.get("changed") else "the node was so already"
    else:
        how = "every GPU freed" if result.get("ok") else "not every GPU was freed"
    text: list[Span] = [f", ran on a retry: {how}."]
    if isinstance(action, int):
        text += [" Its record: ", Code(show_command(action)), "."]
    at = unix(a.finished_at)
    if at is not None:
        text += [" Ended ", Date(at, DateStyle.TIME), "."]
    return _thread(a, "▶", "ran on a retry", *text)


def may_repeat(msg: Message, of: datetime) -> Message:
    """Return ``msg`` saying, first, that it may repeat the post of ``of``."""
    line = context(("this may repeat the message of ", Date(of.timestamp(), DateStyle.TIME)))
    return replace(msg, body=(line, *msg.body))


class ApprovalWords:
    """The duty's words as chat messages (``services.approval_duty.Words``)."""

    def __init__(self, valid_s: float) -> None:
        """``valid_s``: how long an approval stays valid (``[approvals] expiry_s``)."""
        self.valid_s = valid_s

    def request(self, a: Approval) -> Message:
        """The request to on-call, with its buttons."""
        expires = unix(a.expires_at) or 0.0
        return render_request(a.id, a.plan, a.requester, a.request.requester_user, expires)

    def reping(self, a: Approval, who: Sequence[str]) -> Message:
        """The re-ping in the request's thread: who was asked, and when it expires."""
        names = joined(Mention(w) for w in who)
        text: tuple[Span, ...] = (
            f"⏰ {what(a)} is still undecided: half its time is gone and it expires at ",
            Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
            ".",
            NL,
            "Asked: ",
            *(names or ["nobody here (no approver of this front end is configured)"]),
        )
        return Message(None, (Section(text),), f"Request #{a.id} on {a.node} is still undecided")

    def expired(self, a: Approval) -> Message:
        """The word to the requester of a request nobody decided in time."""
        text: list[Span] = [
            f"⌛ Your request #{a.id} ({_asked(a)}) expired at ",
            Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
            ", nobody decided; nothing was done. If it is still needed, ask again: ",
            Code(_again(a)),
            ".",
        ]
        if a.ref is not None:
            text += [" The request: ", Place(a.ref), "."]
        return Message(None, (Section(tuple(text)),), f"Request #{a.id} expired: nothing was done")

    def told(self, purpose: Purpose, a: Approval) -> Message | None:
        """The word of ``purpose`` about an approved action that did not end (None: none now)."""
        if purpose is Purpose.WAITING and a.state is ApprovalState.WAITING:
            return render_waiting(a, self.valid_s)
        render = {
            Purpose.INTERRUPTED_DM: render_interrupted_dm,
            Purpose.INTERRUPTED: render_interrupted,
            Purpose.GAVE_UP: render_gave_up,
            Purpose.RETRIED: render_retried,
        }.get(purpose)
        return None if render is None else render(a)
