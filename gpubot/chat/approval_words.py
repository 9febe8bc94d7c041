"""What the approval duty (``services.approval_duty``) says, as neutral messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from gpubot.chat.approval_told import THREAD, render_interrupted_dm, render_waiting, what
from gpubot.chat.message import NL, Code, Date, DateStyle, Mention, Message, Place, Section, Span
from gpubot.chat.message import ctx as context
from gpubot.chat.reset_view import gpu_list, render_approval_request
from gpubot.core.approval.model import Approval
from gpubot.core.approval.posts import Purpose
from gpubot.core.models import ApprovalState
from gpubot.services.approvals import unix


def may_repeat(msg: Message, of: datetime) -> Message:
    """Return ``msg`` saying, first, that it may repeat the post of ``of``."""
    note = context(("this may repeat the message of ", Date(of.timestamp(), DateStyle.TIME)))
    return replace(msg, body=(note, *msg.body))


class ApprovalWords:
    """The duty's words as chat messages (``services.approval_duty.Words``)."""

    def __init__(self, valid_s: float) -> None:
        """``valid_s``: how long an approval stays valid (``[approvals] expiry_s``)."""
        self.valid_s = valid_s

    def request(self, a: Approval) -> Message:
        """The request to on-call, with its buttons."""
        expires = unix(a.expires_at) or 0.0
        return render_approval_request(a.id, a.plan, a.requester, a.request.requester_user, expires)

    def reping(self, a: Approval, who: Sequence[str]) -> Message:
        """The re-ping in the request's thread: who was asked, and when it expires."""
        names: list[Span] = []
        for i, w in enumerate(who):
            names += [", ", Mention(w)] if i else [Mention(w)]
        text: tuple[Span, ...] = (
            f"⏰ {what(a)} is still undecided: half its time is gone and it expires at ",
            Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
            ".",
            NL,
            "Asked: ",
            *(names or ["nobody (no approvers configured)"]),
        )
        return Message(None, (Section(text),), f"Request #{a.id} on {a.node} is still undecided")

    def expired(self, a: Approval) -> Message:
        """The word to the requester of a request nobody decided in time."""
        gpus = gpu_list(a.plan.gpus)
        text: list[Span] = [
            f"⌛ Your request #{a.id} (forced kill on {a.node} GPU {gpus}) expired at ",
            Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
            ", nobody decided; nothing was done. If it is still needed, ask again: ",
            Code(f"/gpu reset {a.node} gpu {gpus.replace(' ', '')}"),
            ".",
        ]
        if a.ref is not None:
            text += [" The request: ", Place(a.ref), "."]
        return Message(None, (Section(tuple(text)),), f"Request #{a.id} expired: nothing was done")

    def told(self, purpose: Purpose, a: Approval) -> Message | None:
        """The word of ``purpose`` about an approved action that did not end (None: none now)."""
        if purpose is Purpose.INTERRUPTED_DM:
            return render_interrupted_dm(a)
        if purpose is Purpose.WAITING and a.state is ApprovalState.WAITING:
            return render_waiting(a, self.valid_s)
        render = THREAD.get(purpose)
        return None if render is None else render(a)
