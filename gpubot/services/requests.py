"""Resets, and drains or resumes of Slurm nodes, people ask for, approval and all: permit →
plan → refuse → open → post → remember → decide → execute, as one service every front end
calls.

A front end asks once (``reset``, ``gpu_reset``, ``decide``) and gets an ``Outcome`` back;
what happens meanwhile comes to its ``RequestSink`` as a ``RequestEvent``. A forced plan is
(or a node change asked by someone who is no approver) is announced to the approvers through
the ``Announce`` the caller passes, and where it landed is
remembered for the buttons. Errors of the services become outcomes: a request never raises a
``GpubotError`` out of this module.
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
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import (
    ApprovalError,
    ApprovalExpired,
    ApproversUnknown,
    GpubotError,
    IdentityRefused,
    NotAnApprover,
    NotPermitted,
    SelfApproval,
    StoreError,
)
from gpubot.services.approvals import ApprovalService
from gpubot.services.diag import DiagRun, DiagService
from gpubot.services.drain import DrainResult, DrainService
from gpubot.services.reset import Ask, ResetResult
from gpubot.services.run_state import ResetEvent

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
    plan: ResetPlan | NodeChange


RequestEvent = Planning | Refusal | Running | Decided | ResetEvent
RequestSink = Callable[[RequestEvent], Awaitable[None]]
# Post a request for the approvers (a forced plan, a node change); return where it landed
# (None: not posted).
Announce = Callable[[Approval, ResetPlan | NodeChange], Awaitable[Any]]


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
    """A forced plan or a node change waits for an approver; ``posted``: its request reached
    them."""

    approval: Approval
    plan: ResetPlan | NodeChange
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


@dataclass(frozen=True)
class Changed:
    """A drain or resume ran through Slurm (``result.changed`` False: nothing to change);
    ``approval``: the request it ran for (None: an approver's own)."""

    result: DrainResult
    approval: Approval | None = None


Outcome = Refused | Failed | Done | Pending | Busy | Expired | Closed | Changed
SlurmOutcome = Refused | Failed | Changed | Pending


class RequestService:
    """Runs the reset requests of every front end over the approval and reset services."""

    def __init__(
        self, approvals: ApprovalService | None, drains: DrainService | None = None
    ) -> None:
        self.approvals = approvals  # None: no audit store, so no resets (fail closed)
        self.deciding: set[int] = set()  # approvals being decided now (double clicks)
        self.drains = drains  # None: made over the reset engine's nodes and log when first used

    def _drain_service(self) -> DrainService:
        if self.drains is None:
            self.drains = self._service().drains()
        return self.drains

    def _service(self) -> ApprovalService:
        if self.approvals is None:
            raise StoreError("resets need the audit log, which could not be opened")
        return self.approvals

    async def refuse(
        self, ask: Ask, exc: GpubotError, sink: RequestSink, *, action: str, node: str | None
    ) -> None:
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
            floor = floor_note(plan, ask.who.linux_user, approvals.policy.min_uid)
            if floor is not None:  # refused as self-service; on-call may still approve it
                await self.refuse(ask, NotPermitted(floor), sink, action="reset", node=plan.node)
            return await self._open(ask, cmd, plan, announce)

        async def run() -> ResetResult:
            return await approvals.run(
                replace(ask, grace_s=cmd.grace_s, on_event=sink), plan, before
            )

        return await self._run(sink, Running(plan), run)

    async def _open(
        self, ask: Ask, cmd: commands.Reset | None, plan: ResetPlan | NodeChange, announce: Announce
    ) -> Pending | Failed:
        approvals = self._service()
        try:
            grace = None if cmd is None else cmd.grace_s
            approval = await approvals.open(replace(ask, grace_s=grace), plan)
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
        try:
            if not await self._permitted(ask, sink, "gpu-reset", cmd.node):
                return Refused()
            approvals = self._service()
        except GpubotError as exc:
            return Failed(exc)

        async def run() -> ResetResult:
            return await approvals.reset.gpu_reset(cmd.node, cmd.gpu, replace(ask, on_event=sink))

        return await self._run(sink, Running(None), run)

    async def diag(
        self, ask: Ask, cmd: commands.Diag, sink: RequestSink
    ) -> DiagRun | Refused | Failed:
        """Run DCGM's diagnostic on one GPU: who may reset on the node may (the same check as
        ``gpu_reset``, refusals audited); the run is audited by ``DiagService``."""
        try:
            if not await self._permitted(ask, sink, "diag", cmd.node):
                return Refused()
            approvals = self._service()
            r = approvals.reset
            service = DiagService(r.settings, r.transport, r.store, r.status, r.locks)
            return await service.run(ask, cmd.node, cmd.gpu, cmd.level)
        except GpubotError as exc:
            return Failed(exc)

    async def slurm_state(
        self,
        ask: Ask,
        cmd: commands.Drain | commands.Resume,
        sink: RequestSink,
        announce: Announce,
    ) -> SlurmOutcome:
        """Drain or resume a Slurm node. An on-call approver's own request is the approval,
        recorded as such, and runs at once; one who may act on the node ([permissions], as for
        resets) opens a request for the approvers (announced with ``announce``), which runs
        once approved (``decide``). Anyone else is refused, and audited as refused."""
        drain = isinstance(cmd, commands.Drain)
        action = "drain" if drain else "resume"
        reason = cmd.reason if isinstance(cmd, commands.Drain) else None
        try:
            approvals, drains = self._service(), self._drain_service()
            drains.check(cmd.node)  # a known node that Slurm owns, or one line
            try:
                approver = await self._may_change_slurm(approvals, ask, action, cmd.node)
            except WHO_REFUSALS as exc:
                await self.refuse(ask, exc, sink, action=action, node=cmd.node)
                return Refused()
            if not approver:
                return await self._open(ask, None, NodeChange(cmd.node, drain, reason), announce)
            who = ask.who
            approval = {
                "by": "approver",  # an approver's own request: their act is the approval
                "approver": who.id,
                "approver_name": who.name or who.linux_user or who.id,
                "approver_user": who.linux_user,
            }
            result = await drains.change(
                ask, cmd.node, drain=drain, reason=reason, approval=approval
            )
        except GpubotError as exc:
            return Failed(exc)
        return Changed(result)

    async def _may_change_slurm(
        self, approvals: ApprovalService, ask: Ask, action: str, node: str
    ) -> bool:
        """Return whether ``ask.who`` is an on-call approver (False: one who may act on the
        node, whose request needs an approver); raise one of ``WHO_REFUSALS`` if neither."""
        if ask.who.refused is not None:
            raise IdentityRefused(ask.who.refused)
        try:
            if await approvals.is_approver(ask.who):
                return True
        except ApproversUnknown:  # the on-call group unreadable: they may still ask an approver
            pass
        await approvals.check_may_reset(ask.who, node, doing=f"{action} Slurm's node")
        return False

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

    async def _refuse_who(
        self, approval_id: int, approve: bool, ask: Ask, sink: RequestSink, exc: GpubotError
    ) -> Refused:
        node = await self.node_of(approval_id)
        await self.refuse(ask, exc, sink, action="approve" if approve else "deny", node=node)
        return Refused()

    async def _decide(
        self,
        approvals: ApprovalService,
        approval_id: int,
        approve: bool,
        ask: Ask,
        sink: RequestSink,
    ) -> Outcome:
        try:
            approval = await approvals.decide(approval_id, ask, approve)
        except WHO_REFUSALS as exc:
            return await self._refuse_who(approval_id, approve, ask, sink, exc)
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
        if isinstance(plan, NodeChange):
            try:
                changed = await approvals.execute_change(approval, source=ask.source)
            except GpubotError as exc:
                return Failed(exc, approval)
            return Changed(changed, approval)

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
        try:
            await approvals.check_decision(approval_id, ask.who, approve)
        except WHO_REFUSALS as exc:
            return await self._refuse_who(approval_id, approve, ask, sink, exc)
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
        if self.approvals is None:
            return []
        return await self.approvals.expire_due(source)
