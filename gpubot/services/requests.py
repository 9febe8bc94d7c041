"""Resets people ask for, approval and all: permit → plan → refuse → open → post → remember →
decide → execute, as one service every front end calls.

A front end asks once (``reset``, ``gpu_reset``, ``decide``) and gets an outcome back; what
happens meanwhile comes to its ``RequestSink`` as events: ``Planning`` (permitted: a plan is
being made), ``Refusal`` (a refusal to tell the person; it is audited already), ``Running``
(the reset starts), each ``ResetEvent`` of the run, and ``Decided`` (a request was decided).
A forced plan is announced to the approvers through the ``Announce`` the caller passes, and
where it landed is remembered for the buttons. Errors of the services become outcomes: a
request never raises a ``GpubotError`` out of this module.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from gpubot.core import commands
from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import Approval
from gpubot.core.models import ApprovalState
from gpubot.core.policy import floor_note
from gpubot.core.reset.plan import ResetPlan
from gpubot.errors import (
    ApprovalError,
    ApprovalExpired,
    ApproversUnknown,
    GpubotError,
    NotAnApprover,
    NotPermitted,
    SelfApproval,
    StoreError,
)
from gpubot.services.approvals import ApprovalService
from gpubot.services.reset import Ask, ResetResult
from gpubot.services.reset_run import ResetEvent

log = logging.getLogger(__name__)

# Refused for who the person is, not for the state of a request: these are audited.
WHO_REFUSALS = (NotPermitted, NotAnApprover, SelfApproval, ApproversUnknown)


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planning:
    """The person may reset on ``node``: a plan is being made."""

    node: str


@dataclass(frozen=True)
class Refusal:
    """Tell the person they are refused (audited already)."""

    error: GpubotError


@dataclass(frozen=True)
class Running:
    """A reset starts: ``plan`` (None: a GPU reset, which has no plan to show)."""

    plan: ResetPlan | None
    approval: Approval | None = None


@dataclass(frozen=True)
class Decided:
    """A request was decided (approved, denied or cancelled) by the asker."""

    approval: Approval
    plan: ResetPlan


RequestEvent = Planning | Refusal | Running | Decided | ResetEvent
RequestSink = Callable[[RequestEvent], Awaitable[None]]
# Post a forced plan's request for the approvers; return where it landed (None: not posted).
Announce = Callable[[Approval, ResetPlan], Awaitable[Any]]


# -- outcomes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """Nothing was done: the person was refused (a ``Refusal`` told them why)."""


@dataclass(frozen=True)
class Failed:
    """The request failed with ``error`` (before, or while, running)."""

    error: GpubotError
    approval: Approval | None = None


@dataclass(frozen=True)
class Done:
    """The reset ran to its end."""

    result: ResetResult
    approval: Approval | None = None


@dataclass(frozen=True)
class Pending:
    """A forced plan waits for an approver; ``posted``: its request reached them."""

    approval: Approval
    plan: ResetPlan
    posted: bool


@dataclass(frozen=True)
class Busy:
    """Someone's decision of the same request is in flight: nothing was decided."""


@dataclass(frozen=True)
class Expired:
    """The request had expired (``approval``: as it is now, if it could be read)."""

    error: ApprovalExpired
    approval: Approval | None


@dataclass(frozen=True)
class Closed:
    """The request was denied or cancelled: nothing runs."""

    approval: Approval


Outcome = Refused | Failed | Done | Pending | Busy | Expired | Closed


class RequestService:
    """Runs the reset requests of every front end over the approval and reset services."""

    def __init__(self, approvals: ApprovalService | None, *, min_uid: int) -> None:
        self.approvals = approvals  # None: no audit store, so no resets (fail closed)
        self.min_uid = min_uid
        self.deciding: set[int] = set()  # approvals being decided now (double clicks)

    def _service(self) -> ApprovalService:
        if self.approvals is None:
            raise StoreError("resets need the audit log, which could not be opened")
        return self.approvals

    async def refuse(
        self, ask: Ask, exc: GpubotError, sink: RequestSink, *, action: str, node: str | None
    ) -> None:
        """Tell ``sink`` of the refusal, and audit who tried what."""
        await sink(Refusal(exc))
        if self.approvals is not None:
            await self.approvals.record_refusal(ask, action=action, node=node, reason=str(exc))

    async def _permitted(self, ask: Ask, sink: RequestSink, action: str, node: str) -> bool:
        """Whether ``ask.who`` may reset on ``node`` (else the refusal is told and audited)."""
        try:
            await self._service().check_may_reset(ask.who, node)
        except NotPermitted as exc:
            await self.refuse(ask, exc, sink, action=action, node=node)
            return False
        await sink(Planning(node))
        return True

    async def reset(
        self, ask: Ask, cmd: commands.Reset, sink: RequestSink, announce: Announce
    ) -> Outcome:
        """Plan; run at once if only the asker's processes die, else open a request for the
        approvers (announced with ``announce``)."""
        try:
            if not await self._permitted(ask, sink, "reset", cmd.node):
                return Refused()
            approvals = self._service()
            plan, before = await approvals.plan(ask.who, cmd)
        except GpubotError as exc:
            return Failed(exc)
        if plan.forced:
            floor = floor_note(plan, ask.who.linux_user, self.min_uid)
            if floor is not None:  # refused as self-service; on-call may still approve it
                await self.refuse(ask, NotPermitted(floor), sink, action="reset", node=plan.node)
            return await self._open(ask, cmd, plan, announce)

        async def run() -> ResetResult:
            return await approvals.run(
                replace(ask, grace_s=cmd.grace_s, on_event=sink), plan, before
            )

        return await self._run(sink, Running(plan), run)

    async def _open(
        self, ask: Ask, cmd: commands.Reset, plan: ResetPlan, announce: Announce
    ) -> Outcome:
        approvals = self._service()
        try:
            approval = await approvals.open(replace(ask, grace_s=cmd.grace_s), plan)
        except GpubotError as exc:
            return Failed(exc)
        where = await announce(approval, plan)
        if where is not None:
            await self.remember(approval.id, where)
        return Pending(approval, plan, where is not None)

    async def remember(self, approval_id: int, where: MessageRef) -> None:
        """Remember where a request's message is (its buttons still work if this fails)."""
        try:
            await self._service().approvals.set_message(approval_id, where)
        except StoreError as exc:
            log.warning("approval %s: cannot remember its message: %s", approval_id, exc)

    async def gpu_reset(self, ask: Ask, cmd: commands.GpuReset, sink: RequestSink) -> Outcome:
        """Reset one idle GPU whose memory leaked."""
        try:
            if not await self._permitted(ask, sink, "gpu-reset", cmd.node):
                return Refused()
            approvals = self._service()
        except GpubotError as exc:
            return Failed(exc)

        async def run() -> ResetResult:
            return await approvals.reset.gpu_reset(cmd.node, cmd.gpu, replace(ask, on_event=sink))

        return await self._run(sink, Running(None), run)

    async def _run(
        self, sink: RequestSink, running: Running, run: Callable[[], Awaitable[ResetResult]]
    ) -> Outcome:
        await sink(running)
        try:
            return Done(await run(), running.approval)
        except GpubotError as exc:
            return Failed(exc, running.approval)

    # -- deciding --------------------------------------------------------------------------

    async def decide(self, approval_id: int, approve: bool, ask: Ask, sink: RequestSink) -> Outcome:
        """Approve or deny a forced kill; an approval runs the plan once."""
        try:
            approvals = self._service()
        except StoreError as exc:
            return Failed(exc)
        if approval_id in self.deciding:
            return await self._in_flight(approvals, approval_id, approve, ask, sink)
        self.deciding.add(approval_id)
        try:
            return await self._decide(approvals, approval_id, approve, ask, sink)
        finally:
            self.deciding.discard(approval_id)

    async def _decide(
        self,
        approvals: ApprovalService,
        approval_id: int,
        approve: bool,
        ask: Ask,
        sink: RequestSink,
    ) -> Outcome:
        verb = "approve" if approve else "deny"
        try:
            approval = await approvals.decide(approval_id, ask, approve)
        except WHO_REFUSALS as exc:
            node = await self.node_of(approval_id)
            await self.refuse(ask, exc, sink, action=verb, node=node)
            return Refused()
        except ApprovalExpired as exc:
            try:
                return Expired(exc, await approvals.approvals.get(approval_id))
            except StoreError:
                return Expired(exc, None)
        except (ApprovalError, StoreError) as exc:
            return Failed(exc)
        plan = approval.request.plan
        await sink(Decided(approval, plan))
        if approval.state is not ApprovalState.APPROVED:
            return Closed(approval)

        async def run() -> ResetResult:
            return await approvals.execute(approval, source=ask.source, on_event=sink)

        return await self._run(sink, Running(plan, approval), run)

    async def _in_flight(
        self,
        approvals: ApprovalService,
        approval_id: int,
        approve: bool,
        ask: Ask,
        sink: RequestSink,
    ) -> Outcome:
        """A click while someone's decision of the same request is in flight: one who may not
        decide is still refused and audited as such; a legitimate one is told to wait."""
        verb = "approve" if approve else "deny"
        try:
            await approvals.check_decision(approval_id, ask.who, approve)
        except WHO_REFUSALS as exc:
            node = await self.node_of(approval_id)
            await self.refuse(ask, exc, sink, action=verb, node=node)
            return Refused()
        except (ApprovalError, StoreError):
            pass
        return Busy()

    async def node_of(self, approval_id: int) -> str | None:
        """Return the node an approval is about, if it can be read (for the audit record)."""
        try:
            found = await self._service().approvals.get(approval_id)
        except StoreError:
            return None
        return None if found is None else found.node

    async def expire_due(self, source: str | None = None) -> list[Approval]:
        """Expire the requests (of ``source`` only, if given) whose time is up; return them."""
        if self.approvals is None:
            return []
        return await self.approvals.expire_due(source)
