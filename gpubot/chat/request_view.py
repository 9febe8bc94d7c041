"""A request for approval as chat shows it, whichever it is: a forced kill (``reset_view``) or a
change of a Slurm node (``drain_view``); one mechanism, one set of buttons."""

from __future__ import annotations

from collections.abc import Callable

from gpubot.chat.drain_view import render_change_request, render_change_state
from gpubot.chat.message import Message, Text
from gpubot.chat.reset_view import Decision, render_approval_request, render_approval_state
from gpubot.core.approval.model import Approval
from gpubot.core.models import ApprovalState
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.services.approvals import unix


def render_request(
    approval_id: int,
    plan: ResetPlan | NodeChange,
    requester_id: str,
    requester_user: str | None,
    expires_at: float,
    *,
    context: Text = (),
) -> Message:
    """Render a request for approval, whichever it is: a forced kill or a node change."""
    if isinstance(plan, NodeChange):
        return render_change_request(
            approval_id, plan, requester_id, requester_user, expires_at, context=context
        )
    return render_approval_request(
        approval_id, plan, requester_id, requester_user, expires_at, context=context
    )


def render_request_state(
    approval_id: int,
    plan: ResetPlan | NodeChange,
    requester_id: str,
    requester_user: str | None,
    decision: Decision,
    *,
    body: Message | None = None,
    note: str | None = None,
) -> Message:
    """Render where a request stands, whichever it is: a forced kill or a node change."""
    if isinstance(plan, NodeChange):
        return render_change_state(
            approval_id, plan, requester_id, requester_user, decision, body=body, note=note
        )
    return render_approval_state(
        approval_id, plan, requester_id, requester_user, decision, body=body, note=note
    )


def request_framer(a: Approval) -> Callable[[Message | None], Message]:
    """Return a function that wraps a body in the approval's header and decision line."""
    user = a.request.requester_user
    at = unix(a.decided_at) if a.state is not ApprovalState.EXPIRED else unix(a.expires_at)

    def frame(body: Message | None) -> Message:
        decision = Decision(str(a.state), a.decided_by, at)
        return render_request_state(a.id, a.plan, a.requester, user, decision, body=body)

    return frame
