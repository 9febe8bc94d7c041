"""Approvals: who asks, who may approve, and running an approved plan once: a forced reset
through the reset engine, or a Slurm node's drain or resume through the drain service.

The store's conditional transition is the backstop; this service adds what the store cannot
know: the chat → Linux identity, approver membership, node permissions, one person behind two
chat accounts. It speaks to chat only through the ``Directory`` port.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpubot.core.approval.model import (
    Approval,
    ApprovalRequest,
    cannot_run,
    run_now,
    run_until,
    stopped,
)
from gpubot.core.approval.ports import ApprovalStore
from gpubot.core.clock import SYSTEM_CLOCK, steps_of
from gpubot.core.commands import Reset
from gpubot.core.models import ActionStatus, ApprovalState, NodeSnapshot
from gpubot.core.policy import (
    ChatAccount,
    Person,
    Policy,
    is_approver,
    may_reset,
    resolve,
    same_person,
)
from gpubot.core.ports import AuditStore, Clock
from gpubot.core.reset.plan import ResetPlan, ResetRequest
from gpubot.core.slurm.drain import NodeChange
from gpubot.core.timefmt import iso
from gpubot.errors import (
    ApprovalError,
    ApproversUnknown,
    GpubotError,
    IdentityRefused,
    LockHeld,
    NotAnApprover,
    NotPermitted,
    ResetRefused,
    SelfApproval,
    StoreError,
)
from gpubot.services.directory import Directory, NoDirectory
from gpubot.services.drain import DrainResult, DrainService, drain_lock
from gpubot.services.reset import Ask, ResetResult, ResetService, reset_lock
from gpubot.services.run_state import EventSink

log = logging.getLogger(__name__)

ACCOUNT_TTL_S = 60.0  # a deactivated or demoted account is refused within this


def unix(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


@dataclass(frozen=True)
class ApprovalPorts:
    """What the approvals service works with (the reset engine's nodes and locks too); the
    audit log is for refusals."""

    approvals: ApprovalStore
    reset: ResetService
    audit: AuditStore
    directory: Directory = field(default_factory=NoDirectory)
    clock: Clock = SYSTEM_CLOCK


class ApprovalService:
    """Who is who, permissions, approvals; executes approved plans through the reset engine."""

    def __init__(self, policy: Policy, ports: ApprovalPorts) -> None:
        self.policy = policy
        self.approvals = ports.approvals
        self.reset = ports.reset
        self.nodes = ports.reset.status
        self.locks = ports.reset.locks
        self.audit = ports.audit
        self.directory = ports.directory
        self.clock = ports.clock
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}
        self._accounts: dict[str, tuple[float, ChatAccount | None]] = {}
        self._team: str | None = None
        self.running: set[int] = set()  # approvals this process runs now: never abandoned
        self.unrecorded: dict[int, str] = {}  # waiting, but the store could not be told: why
        self.abandoned: list[Approval] = []  # marked incomplete, not told in chat yet
        self._drains: DrainService | None = None

    def drains(self) -> DrainService:
        """Return the drain service, over the reset engine's nodes, transport, log and locks."""
        if self._drains is None:
            r = self.reset
            self._drains = DrainService(r.settings, r.transport, r.store, r.status, r.locks)
        return self._drains

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    # -- who ---------------------------------------------------------------------------------

    async def identify(self, user_id: str, name: str) -> Person:
        """Return who ``user_id`` is on the boxes, or why they are refused (``resolve``)."""
        if user_id in self.policy.bots:  # no need to ask the chat system about its own bots
            return Person(user_id, name, None, resolve(self.policy, user_id, None, None).refused)
        try:
            account = await self._account(user_id)
            team = None if account is None else await self._home_team()
        except GpubotError as exc:  # fail closed: an account we cannot check is not trusted
            log.warning("cannot check the account %s: %s", user_id, exc)
            why = f"gpubot cannot check your chat account just now ({exc}): try again shortly"
            return Person(user_id, name, None, why)
        found = resolve(self.policy, user_id, account, team)
        return Person(user_id, name, found.linux_user, found.refused)

    async def _account(self, user_id: str) -> ChatAccount | None:
        now = self.clock.now()
        cached = self._accounts.get(user_id)
        if cached is not None and now - cached[0] < ACCOUNT_TTL_S:
            return cached[1]
        account = await self.directory.account(user_id)
        self._accounts[user_id] = (now, account)
        return account

    async def _home_team(self) -> str | None:
        if self._team is None:
            self._team = await self.directory.home_team()
        return self._team

    async def _groups_now(
        self, groups: tuple[str, ...]
    ) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
        """Return the members of ``groups``, and those unreadable now (with why): a list is
        cached ``group_cache_s`` at most, and a failed re-read is unreadable, never stale."""
        found: dict[str, frozenset[str]] = {}
        unreadable: dict[str, str] = {}
        for group in groups:
            now = self.clock.now()
            cached = self._groups.get(group)
            if cached is not None and now - cached[0] < self.policy.group_cache_s:
                found[group] = cached[1]
                continue
            try:
                members = await self.directory.group_members(group)
            except GpubotError as exc:
                log.warning("cannot read user group %s: %s", group, exc)
                self._groups.pop(group, None)
                unreadable[group] = str(exc)
                continue
            self._groups[group] = (now, members)
            found[group] = members
        return found, unreadable

    async def is_approver(self, who: Person) -> bool:
        """Whether ``who`` may decide forced kills; ``ApproversUnknown`` if that depends on a
        user group that cannot be refreshed."""
        if who.id in self.policy.approvers:
            return True
        found, unreadable = await self._groups_now(self.policy.approver_groups)
        if is_approver(self.policy, who.id, found):
            return True
        if unreadable:
            group, why = next(iter(unreadable.items()))
            raise ApproversUnknown(
                f"gpubot cannot read the on-call user group {group} ({why}) and decides nothing "
                f"on a list older than {self.policy.group_cache_s:g} s ([approvals] "
                "group_cache_s): try again shortly"
            )
        return False

    async def check_may_reset(
        self, who: Person, node_name: str, *, doing: str = "reset GPUs on"
    ) -> None:
        """Raise ``NotPermitted`` unless ``who`` may act on the node ([permissions]: resets,
        and drains or resumes asked of an approver); ``doing`` words the refusal."""
        if who.refused is not None:
            raise IdentityRefused(who.refused)
        node = self.nodes.node(node_name)
        found, unreadable = await self._groups_now(self.policy.groups_to_resolve())
        if not may_reset(self.policy, who.id, node, found):
            unread = f"; user group {', '.join(unreadable)} could not be read" if unreadable else ""
            raise NotPermitted(f"you may not {doing} {node.name} (see [permissions]{unread})")

    # -- asking ------------------------------------------------------------------------------

    async def plan(self, who: Person, cmd: Reset) -> tuple[ResetPlan, NodeSnapshot]:
        """Check permissions, then plan the reset as ``who`` (nothing is signalled)."""
        await self.check_may_reset(who, cmd.node)
        request = ResetRequest(
            cmd.node,
            who.linux_user,
            gpus=cmd.gpus,
            pids=cmd.pids,
            user=cmd.user,
            grace_s=cmd.grace_s,
            min_uid=self.policy.min_uid,
        )
        plan, snap = await self.reset.plan(request)
        # the reason rides on the plan into the request and every audit record; it is added
        # after planning, so it never changes what is signalled
        return replace(plan, reason=cmd.reason), snap

    async def open(self, ask: Ask, plan: ResetPlan | NodeChange) -> Approval:
        """Record a forced kill, or a node change, waiting for approval; refuse if nobody could
        approve it."""
        if not self.policy.approvers and not self.policy.approver_groups:
            what = (
                f"a {plan.verb} of {plan.node} needs an on-call approver, and"
                if isinstance(plan, NodeChange)
                else "this kills other people's processes and"
            )
            raise ResetRefused(
                f"{what} no approvers are configured ([approvals] approvers / usergroup)"
            )
        who = ask.who
        request = ApprovalRequest(
            plan, command=ask.command, grace_s=ask.grace_s, requester_user=who.linux_user
        )
        expiry, now = self.policy.expiry_s, self.now()
        return await self.approvals.create(
            who.id, who.name, plan.node, request, expiry, source=ask.source, now=now
        )

    async def run(self, ask: Ask, plan: ResetPlan, before: NodeSnapshot | None) -> ResetResult:
        """Run a plan that kills only the asker's own processes (refuse a forced one)."""
        if plan.forced:
            raise ResetRefused("this plan kills other people's processes: it needs approval")
        return await self.reset.execute(plan, ask, before=before)

    # -- deciding ----------------------------------------------------------------------------

    async def decide(self, approval_id: int, ask: Ask, approve: bool) -> Approval:
        """Approve or deny once; the requester's own "deny" cancels. Raises ``ApprovalError``
        (or ``IdentityRefused``)."""
        who, source = ask.who, ask.source
        current = await self.check_decision(approval_id, who, approve)
        now = self.now()
        if not approve and current.requester == who.id:
            return await self.approvals.cancel(approval_id, who.id, now, source=source)
        return await self.approvals.decide(
            approval_id, who.id, approve, now, approver_name=who.name, source=source
        )

    async def check_decision(self, approval_id: int, who: Person, approve: bool) -> Approval:
        """Return the approval if ``who`` may decide it (its requester may withdraw it); raise
        ``IdentityRefused``, ``SelfApproval``, ``NotAnApprover`` or ``ApprovalError``."""
        if who.refused is not None:
            raise IdentityRefused(who.refused)
        current = await self.approvals.get(approval_id)
        if current is None:
            raise ApprovalError(f"there is no approval {approval_id}")
        if current.requester != who.id:
            if same_person(current.request.requester_user, who.linux_user):
                raise SelfApproval(
                    f"you cannot {'approve' if approve else 'decide'} a request of your own "
                    f"Linux user ({who.linux_user}) made from another chat account: "
                    "ask another approver"
                )
            if not await self.is_approver(who):
                raise NotAnApprover("only on-call approvers can decide requests for approval")
        return current

    async def execute(
        self, approval: Approval, *, source: str, on_event: EventSink | None = None
    ) -> ResetResult:
        """Run an approved plan (once: only the caller whose decision won gets here)."""
        plan = _approved(approval).plan
        if not isinstance(plan, ResetPlan):
            raise ApprovalError(f"approval {approval.id} is a {plan.verb} of a node, not a reset")
        request, done = approval.request, dict[str, Any]()
        self.running.add(approval.id)  # its end is recorded before the periodic look sees it
        try:
            approver = Person(approval.decided_by or "?", approval.decided_by_name or "", None)
            command = request.command or f"approval {approval.id}"
            ask = Ask(approver, command, source, request.grace_s, on_event)
            result = await self.reset.execute(plan, ask, approval=approval_record(approval))
            done = {"action_id": result.action_id, "ok": result.ok}
            gpus = [g.to_dict() for g in result.gpus]
            await self._finish(approval.id, ok=True, result={**done, "gpus": gpus})
            return result
        except BaseException as exc:  # left "approved" only by a stop: told as interrupted
            if not done and not stopped(exc):
                await self._not_run(approval, exc)
            raise
        finally:
            self.running.discard(approval.id)

    async def execute_change(self, approval: Approval, *, source: str) -> DrainResult:
        """Drain or resume the node as an approved request asks (once, as ``execute``): the
        approver is the actor, and Slurm's reason names them and the audit record."""
        change = _approved(approval).request.change
        if change is None:
            raise ApprovalError(f"approval {approval.id} is a reset, not a change of a node")
        done = dict[str, Any]()
        self.running.add(approval.id)
        try:
            approver = Person(approval.decided_by or "?", approval.decided_by_name or "", None)
            command = approval.request.command or f"approval {approval.id}"
            result = await self.drains().change(
                Ask(approver, command, source),
                change.node,
                drain=change.drain,
                reason=change.reason,
                approval={
                    **approval_record(approval),
                    "approver_user": self.policy.users.get(approval.decided_by or ""),
                },
            )
            done = {"action_id": result.action_id, "ok": True, "changed": result.changed}
            await self._finish(
                approval.id, ok=True, result={**done, "node_state": result.to_dict()}
            )
            return result
        except BaseException as exc:  # as execute: left "approved" only by a stop
            if not done and not stopped(exc):
                await self._not_run(approval, exc)
            raise
        finally:
            self.running.discard(approval.id)

    async def run_approved(self, approval: Approval, *, source: str) -> None:
        """Run an approved request, whichever it is (the retry of a waiting one)."""
        if approval.request.change is not None:
            await self.execute_change(approval, source=source)
        else:
            await self.execute(approval, source=source)

    async def _not_run(self, approval: Approval, exc: BaseException) -> None:
        """Record why an approved action did not run to its end: ``waiting`` (retried) if it
        could not run yet and its approval is still valid, else ``failed``."""
        why, until = cannot_run(exc), run_until(approval, self.policy.expiry_s)
        if why is None or run_now(self.clock, self.policy.expiry_s) >= until:
            await self._finish(approval.id, ok=False, result={"error": str(exc) or repr(exc)})
            return
        waiting = {"error": why, "until": iso(until, timespec="seconds")}
        try:
            await self.approvals.mark_waiting(approval.id, waiting, now=self.now())
        except (StoreError, ApprovalError) as err:  # told again by the retry duty
            log.warning("approval %s: cannot record that it waits: %s", approval.id, err)
            self.unrecorded[approval.id] = why

    async def _finish(self, approval_id: int, *, ok: bool, result: Mapping[str, Any]) -> None:
        """Record the end of an approved action; the reset's own audit record stands anyway."""
        mark = self.approvals.mark_executed if ok else self.approvals.mark_failed
        try:
            await mark(approval_id, result, now=self.now())
        except (StoreError, ApprovalError) as exc:
            log.error("approval %s: cannot record its end: %s", approval_id, exc)

    async def expire_due(self, source: str | None = None) -> list[Approval]:
        """Expire every pending request (of ``source`` only, if given) whose time is up; return
        them (judged by ``expiry_now``: a forward step of the wall clock lasting seconds expires
        nothing)."""
        due = steps_of(self.clock).expiry_now()
        return await self.approvals.expire_due(datetime.fromtimestamp(due, UTC), source)

    async def abandon_approved(
        self, settled_s: float = 0.0, source: str | None = None
    ) -> list[Approval]:
        """Mark ``incomplete`` the approvals (of ``source`` only, if given) a stopped gpubot
        left ``approved`` over ``settled_s`` ago; return them. One a live replica runs holds its
        node's reset lock (a node change: its drain lease) and is left alone, as is one this
        process runs or could not record as waiting."""
        now = self.now()
        marked: list[Approval] = []
        for a in await self.approvals.approved(now - timedelta(seconds=settled_s), source):
            if a.id in self.running or a.id in self.unrecorded:
                continue
            why = {
                "error": "gpubot stopped before this approved action recorded its end: "
                "check the node and the audit log"
            }
            try:
                lock = reset_lock(a.node) if a.request.change is None else drain_lock(a.node)
                async with self.locks.hold(lock, holder="gpubot start-up"):
                    marked.append(await self.approvals.mark_incomplete(a.id, why, now=now))
            except LockHeld:
                log.info("approval %s: its node is being reset by a live gpubot", a.id)
            except ApprovalError as exc:  # it ended meanwhile
                log.info("approval %s: %s", a.id, exc)
        self.abandoned += marked  # the approval duty tells their threads (the start-up's too)
        return marked

    # -- the record of refusals --------------------------------------------------------------

    async def record_refusal(self, ask: Ask, *, action: str, node: str | None, reason: str) -> None:
        store, who = self.audit, ask.who
        who_data = {"id": who.id, "name": who.name, "linux_user": who.linux_user}
        try:
            action_id = await store.begin_action(
                kind=action,
                actor=who.id,
                source=ask.source,
                command=ask.command,
                node=node,
                gpus=(),
                plan={"refused": reason, "who": who_data},
            )
            await store.finish_action(
                action_id, status=ActionStatus.REFUSED, result={"reason": reason}
            )
        except StoreError as exc:  # nothing was done anyway; the log keeps the trace
            log.error("cannot audit a refusal of %s (%s): %s", who.id, reason, exc)


def _approved(approval: Approval) -> Approval:
    if approval.state is not ApprovalState.APPROVED:
        raise ApprovalError(f"approval {approval.id} is {approval.state}, not approved")
    return approval


def approval_record(a: Approval) -> dict[str, Any]:
    """Return who asked and who approved, as recorded with a forced action's intent."""
    return {
        "id": a.id,
        "requester": a.requester,
        "requester_name": a.requester_name,
        "requester_user": a.request.requester_user,
        "reason": a.plan.reason,
        "approver": a.decided_by,
        "approver_name": a.decided_by_name,
        "approved_at": None if a.decided_at is None else iso(a.decided_at, timespec="microseconds"),
    }
