"""An approval for a forced action, as the approvals store hands it out.

``ApprovalRequest`` is what was asked: the plan and how to run it. It is typed here and turned
into JSON (and back) only inside ``gpubot.store`` (``store/approvals.py``), as APScheduler's
``Schedule.marshal``/``unmarshal`` keep a schedule's wire form inside its data store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpubot.core.models import ApprovalState
from gpubot.core.plan import ResetPlan


@dataclass(frozen=True)
class ApprovalRequest:
    """A forced kill waiting for a decision: the plan, the command that asked for it, the grace
    it runs with (None: the default) and the Linux user the requester mapped to when asking
    (None: unknown; an approver of that user is refused)."""

    plan: ResetPlan
    command: str = ""
    grace_s: float | None = None
    requester_user: str | None = None

    @property
    def node(self) -> str:
        """The node the plan is for."""
        return self.plan.node


@dataclass(frozen=True)
class Approval:
    """One request to run a forced action, and its life."""

    id: int
    requester: str  # chat user id (or cli:<user>)
    requester_name: str
    source: str
    node: str
    request: ApprovalRequest
    state: ApprovalState
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_by_name: str | None
    decided_at: datetime | None
    finished_at: datetime | None
    result: Any  # decoded JSON given to mark_executed / mark_failed, or None
    channel: str | None
    message_ts: str | None

    @property
    def plan(self) -> ResetPlan:
        """The plan asked for (``request.plan``)."""
        return self.request.plan
