"""An approval for a forced action, as the approvals store hands it out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpubot.core.models import ApprovalState


@dataclass(frozen=True)
class Approval:
    """One request to run a forced action, and its life."""

    id: int
    requester: str  # Slack user id (or cli:<user>)
    requester_name: str
    source: str
    node: str
    plan: Any  # decoded JSON
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
