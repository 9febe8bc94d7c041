"""The approvals store as the approval service sees it (``store.approvals.DbApprovals``
implements it): its own module, as ``ports`` would otherwise outgrow the size rule."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import Approval, ApprovalRequest


class ApprovalStore(Protocol):
    """Approvals for forced actions; each transition happens at most once (the store's
    conditional update). Every method raises ``StoreError`` on failure, ``ApprovalError``
    (``AlreadyDecided``, ``ApprovalExpired``, ``SelfApproval``) on a refused transition."""

    async def create(
        self,
        requester: str,
        requester_name: str,
        node: str,
        request: ApprovalRequest,
        expires_in_s: float = ...,
        *,
        source: str = ...,
        now: datetime | None = None,
    ) -> Approval:
        """Record a pending request that expires ``expires_in_s`` seconds from ``now``."""

    async def get(self, approval_id: int) -> Approval | None: ...

    async def decide(
        self,
        approval_id: int,
        approver: str,
        approve: bool,
        now: datetime,
        *,
        approver_name: str = ...,
        source: str = ...,
    ) -> Approval:
        """Approve or deny a pending request exactly once (never the requester's own)."""

    async def cancel(
        self, approval_id: int, by: str, now: datetime, *, source: str = ...
    ) -> Approval: ...

    async def mark_executed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval: ...

    async def mark_failed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval: ...

    async def mark_incomplete(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that an approved action never recorded its end (gpubot stopped mid-run)."""

    async def approved(self, decided_before: datetime, source: str | None = None) -> list[Approval]:
        """Return approvals (of ``source`` only, if given) still ``approved`` (not run to an
        end) decided, or last taken by a retry (``taken_at``), before a moment."""

    async def mark_waiting(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that an approved action could not run yet (``result``: why); retried."""

    async def resume(self, approval_id: int, *, now: datetime | None = None) -> Approval:
        """Take a ``waiting`` approval back to ``approved`` to run it (once, of all tries)."""

    async def waiting(self, source: str | None = None) -> list[Approval]:
        """Return the approvals (of ``source`` only, if given) ``waiting`` to be retried,
        oldest first."""

    async def expire_due(self, now: datetime, source: str | None = None) -> list[Approval]:
        """Expire every pending request (of ``source`` only, if given) whose time is up at
        ``now``; return them."""

    async def set_message(self, approval_id: int, ref: MessageRef) -> None:
        """Remember the chat message that shows the request (to update it later)."""

    async def pending(self, source: str | None = None) -> list[Approval]:
        """Return every pending approval (of ``source`` only, if given), oldest first."""
