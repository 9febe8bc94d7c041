"""What an approved action that did not run to an end says, once, in its request's thread and
to its requester: interrupted, waiting to run, given up, run on a retry. Approved means run or
told: these are the "told".
"""

from __future__ import annotations

from collections.abc import Callable

from gpubot.chat.message import Code, Date, DateStyle, Mention, Message, Place, Section, Span
from gpubot.chat.reset_view import gpu_list
from gpubot.core.approval.model import Approval, run_until
from gpubot.core.approval.posts import Purpose
from gpubot.core.reset.interrupted import show_command
from gpubot.services.approvals import unix


def what(a: Approval) -> str:
    """Return "Request #ID (forced kill on NODE GPU N)"."""
    return f"Request #{a.id} (forced kill on {a.node} GPU {gpu_list(a.plan.gpus)})"


def _who(a: Approval) -> tuple[Span, ...]:
    return ("asked by ", Mention(a.requester), ", approved by ", Mention(a.decided_by or "?"))


def _why(a: Approval) -> str:
    found = a.result.get("error") if isinstance(a.result, dict) else None
    return str(found or "the reason was not recorded")


def _message(a: Approval, text: tuple[Span, ...], fallback: str) -> Message:
    return Message(None, (Section(text),), f"Request #{a.id} on {a.node}: {fallback}")


def render_interrupted(a: Approval) -> Message:
    """In the thread: gpubot stopped while running it; it is marked incomplete, not run again."""
    text: tuple[Span, ...] = (
        f"⚠ {what(a)}, ",
        *_who(a),
        ", was interrupted: gpubot stopped while running it, and it is marked incomplete. "
        "It is not run again. Check the node; what it did is in the audit log: ",
        Code("gpubot audit list --incomplete"),
        ".",
    )
    return _message(a, text, "interrupted")


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
    return _message(a, tuple(text), "interrupted")


def render_waiting(a: Approval, valid_s: float) -> Message:
    """In the thread: approved, but it could not run yet; retried until its approval lapses."""
    until = run_until(a, valid_s).timestamp()
    text: tuple[Span, ...] = (
        f"⏳ {what(a)}, ",
        *_who(a),
        f", could not run yet: {_why(a)}. Nothing was done; gpubot retries it until ",
        Date(until, DateStyle.TIME),
        " and says here how it ends.",
    )
    return _message(a, text, "waiting to run")


def render_gave_up(a: Approval) -> Message:
    """In the thread: it never could run while approved; nothing was done."""
    text: tuple[Span, ...] = (
        f"⚠ {what(a)}, ",
        *_who(a),
        f", never ran: {_why(a)}. Nothing was done. If it is still needed, ask again: ",
        Code(f"/gpu reset {a.node} gpu {','.join(map(str, a.plan.gpus))}"),
        ".",
    )
    return _message(a, text, "never ran")


def render_retried(a: Approval) -> Message:
    """In the thread: a retry ran it; how it ended, and where its record is."""
    result = a.result if isinstance(a.result, dict) else {}
    action = result.get("action_id")
    if "error" in result:
        how = f"it failed: {result['error']}"
    else:
        how = "every GPU freed" if result.get("ok") else "not every GPU was freed"
    text: list[Span] = [f"▶ {what(a)}, ", *_who(a), f", ran on a retry: {how}."]
    if isinstance(action, int):
        text += [" Its record: ", Code(show_command(action)), "."]
    at = unix(a.finished_at)
    if at is not None:
        text += [" Ended ", Date(at, DateStyle.TIME), "."]
    return _message(a, tuple(text), "ran on a retry")


# The thread's word for each purpose (the waiting note also needs how long it is retried).
THREAD: dict[Purpose, Callable[[Approval], Message]] = {
    Purpose.INTERRUPTED: render_interrupted,
    Purpose.GAVE_UP: render_gave_up,
    Purpose.RETRIED: render_retried,
}
