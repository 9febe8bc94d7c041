"""Approvals: who asks, who may ask where, who may approve, and running an approved plan once.

The store's conditional transition (pending → approved exactly once, never by the requester,
never after expiry) is the backstop; this service adds what the store cannot know: the Slack →
Linux identity, approver membership (user ids and Slack user groups, cached briefly) and node
permissions. It speaks to chat only through the ``Directory`` port.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpubot.core.commands import Reset
from gpubot.core.models import ApprovalState, NodeSnapshot
from gpubot.core.plan import ResetPlan, ResetRequest
from gpubot.core.policy import Policy, is_approver, linux_user, may_reset
from gpubot.errors import (
    ApprovalError,
    GpubotError,
    NotAnApprover,
    NotPermitted,
    ResetRefused,
    StoreError,
)
from gpubot.services.reset import ResetEvent, ResetResult, ResetService
from gpubot.store import Approval, ApprovalStore

log = logging.getLogger(__name__)

GROUP_TTL_S = 60.0
EMAIL_TTL_S = 600.0


class Directory(Protocol):
    """What the service asks the chat system about people (Slack; nothing on the console)."""

    async def group_members(self, group_id: str) -> frozenset[str]:
        """Return the user ids in a user group; raise ``GpubotError`` when it cannot tell."""
        ...

    async def email(self, user_id: str) -> str | None:
        """Return the user's profile e-mail, or None."""
        ...


class NoDirectory:
    """A directory that knows nobody's groups or e-mail (the console)."""

    async def group_members(self, group_id: str) -> frozenset[str]:
        """Return no members."""
        return frozenset()

    async def email(self, user_id: str) -> str | None:
        """Return no e-mail."""
        return None


@dataclass(frozen=True)
class Identity:
    """A person talking to gpubot: chat user id, display name, and Linux user (None: unknown)."""

    id: str
    name: str
    linux_user: str | None


EventSink = Callable[[ResetEvent], Awaitable[None]]


def plan_of(approval: Approval) -> ResetPlan:
    """Return the plan stored with an approval."""
    return ResetPlan.from_dict(approval.plan)


def unix(moment: datetime | None) -> float | None:
    """Return an aware datetime as unix seconds (None stays None)."""
    return None if moment is None else moment.timestamp()


class ApprovalService:
    """Identity, permissions, approvals; executes approved plans through the reset engine."""

    def __init__(
        self,
        policy: Policy,
        approvals: ApprovalStore,
        reset: ResetService,
        directory: Directory,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.approvals = approvals
        self.reset = reset
        self.directory = directory
        self.clock = clock
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}
        self._emails: dict[str, tuple[float, str | None]] = {}

    # -- who ---------------------------------------------------------------------------------

    async def identify(self, user_id: str, name: str) -> Identity:
        """Return who ``user_id`` is on the boxes (the ``[users]`` table, else e-mail)."""
        email = None
        if user_id not in self.policy.users and self.policy.email_local_part:
            email = await self._email(user_id)
        return Identity(user_id, name, linux_user(self.policy, user_id, email))

    async def members(self) -> dict[str, frozenset[str]]:
        """Resolve every user group the policy mentions (cached ``GROUP_TTL_S``)."""
        out: dict[str, frozenset[str]] = {}
        now = self.clock()
        for group in self.policy.groups_to_resolve():
            cached = self._groups.get(group)
            if cached is not None and now - cached[0] < GROUP_TTL_S:
                out[group] = cached[1]
                continue
            try:
                found = await self.directory.group_members(group)
            except GpubotError as exc:  # fail closed: nobody is in a group we cannot read
                log.warning("cannot read user group %s: %s", group, exc)
                out[group] = cached[1] if cached else frozenset()
                continue
            self._groups[group] = (now, found)
            out[group] = found
        return out

    async def _email(self, user_id: str) -> str | None:
        now = self.clock()
        cached = self._emails.get(user_id)
        if cached is not None and now - cached[0] < EMAIL_TTL_S:
            return cached[1]
        try:
            email = await self.directory.email(user_id)
        except GpubotError as exc:
            log.warning("cannot read the e-mail of %s: %s", user_id, exc)
            return None
        self._emails[user_id] = (now, email)
        return email

    async def is_approver(self, who: Identity) -> bool:
        """Whether ``who`` may decide forced kills."""
        return is_approver(self.policy, who.id, await self.members())

    async def check_may_reset(self, who: Identity, node_name: str) -> None:
        """Raise ``NotPermitted`` unless ``who`` may ask for resets on the node."""
        node = self.reset.status.node(node_name)
        if not may_reset(self.policy, who.id, node, await self.members()):
            raise NotPermitted(f"you may not reset GPUs on {node.name} (see [permissions])")

    # -- asking ------------------------------------------------------------------------------

    async def plan(self, who: Identity, cmd: Reset) -> tuple[ResetPlan, NodeSnapshot]:
        """Check permissions, then plan the reset as ``who`` (nothing is signalled)."""
        await self.check_may_reset(who, cmd.node)
        request = ResetRequest(
            cmd.node, who.linux_user, gpus=cmd.gpus, pids=cmd.pids, user=cmd.user,
            grace_s=cmd.grace_s,
        )  # fmt: skip
        return await self.reset.plan(request)

    async def open(
        self,
        who: Identity,
        plan: ResetPlan,
        *,
        grace_s: float | None,
        command: str,
        source: str,
    ) -> Approval:
        """Record a forced kill waiting for approval; refuse if nobody could approve it."""
        if not self.policy.approvers and not self.policy.approver_groups:
            raise ResetRefused(
                "this kills other people's processes and no approvers are configured "
                "([approvals] approvers / usergroup)"
            )
        stored = {**plan.to_dict(), "grace_s": grace_s, "command": command,
                  "requester_user": who.linux_user}  # fmt: skip
        return await self.approvals.create(
            who.id, who.name, plan.node, stored, self.policy.expiry_s, source=source
        )

    async def run(
        self,
        who: Identity,
        plan: ResetPlan,
        before: NodeSnapshot | None,
        *,
        grace_s: float | None,
        command: str,
        source: str,
        on_event: EventSink | None = None,
    ) -> ResetResult:
        """Run a plan that kills only ``who``'s own processes (refuse a forced one)."""
        if plan.forced:
            raise ResetRefused("this plan kills other people's processes: it needs approval")
        return await self.reset.execute(
            plan, actor=who.id, source=source, command=command, on_event=on_event,
            grace_s=grace_s, before=before,
        )  # fmt: skip

    # -- deciding ----------------------------------------------------------------------------

    async def decide(
        self, approval_id: int, who: Identity, approve: bool, *, source: str
    ) -> Approval:
        """Approve or deny once; the requester's own "deny" cancels. Raises ``ApprovalError``."""
        current = await self.approvals.get(approval_id)
        if current is None:
            raise ApprovalError(f"there is no approval {approval_id}")
        now = datetime.fromtimestamp(self.clock(), UTC)
        if not approve and current.requester == who.id:
            return await self.approvals.cancel(approval_id, who.id, now, source=source)
        if current.requester != who.id and not await self.is_approver(who):
            raise NotAnApprover("only on-call approvers can decide forced kills")
        return await self.approvals.decide(
            approval_id, who.id, approve, now, approver_name=who.name, source=source
        )

    async def execute(
        self, approval: Approval, *, source: str, on_event: EventSink | None = None
    ) -> ResetResult:
        """Run an approved plan (once: only the caller whose decision won gets here)."""
        if approval.state is not ApprovalState.APPROVED:
            raise ApprovalError(f"approval {approval.id} is {approval.state}, not approved")
        plan = plan_of(approval)
        grace = approval.plan.get("grace_s")
        command = str(approval.plan.get("command") or f"approval {approval.id}")
        try:
            result = await self.reset.execute(
                plan, actor=approval.decided_by or "?", source=source, command=command,
                on_event=on_event, approval_id=approval.id,
                grace_s=float(grace) if isinstance(grace, int | float) else None,
            )  # fmt: skip
        except BaseException as exc:  # never leave it "approved" with nothing running
            await self._finish(approval.id, ok=False, result={"error": str(exc) or repr(exc)})
            raise
        await self._finish(approval.id, ok=True, result={
            "action_id": result.action_id, "ok": result.ok,
            "gpus": [g.to_dict() for g in result.gpus],
        })  # fmt: skip
        return result

    async def _finish(self, approval_id: int, *, ok: bool, result: Mapping[str, Any]) -> None:
        """Record the end of an approved action; the reset's own audit record stands anyway."""
        try:
            if ok:
                await self.approvals.mark_executed(approval_id, result)
            else:
                await self.approvals.mark_failed(approval_id, result)
        except (StoreError, ApprovalError) as exc:
            log.error("approval %s: cannot record its end: %s", approval_id, exc)

    async def expire_due(self) -> list[Approval]:
        """Expire every pending request whose time is up; return them."""
        return await self.approvals.expire_due(datetime.fromtimestamp(self.clock(), UTC))
