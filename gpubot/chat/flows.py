"""Chat flows shared by Slack and the console: validate → call a service → render → post/update.

No Slack library here: a front end supplies a ``Surface`` (post, update, reply). Flows never
raise: every error becomes a message. Slow work reports progress by updating one message; the
reset engine never waits on chat (updates are coalesced in a task of their own).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.chat.blocks import Message, escape, mrkdwn, mrkdwn_lines, render_text
from gpubot.chat.fleet_view import FleetRenders
from gpubot.chat.home import render_home, render_refused_home
from gpubot.chat.interrupted import interrupted_for
from gpubot.chat.reset_view import (
    render_approval_request,
    render_approval_state,
    render_audit,
    render_progress,
    render_result,
)
from gpubot.chat.surface import MIN_UPDATE_S, Handle, Progress, Surface
from gpubot.config import Settings
from gpubot.core import commands
from gpubot.core.approval import Approval
from gpubot.core.models import ApprovalState, NodeSnapshot
from gpubot.core.plan import ResetPlan
from gpubot.core.policy import Policy, floor_note
from gpubot.core.ports import AuditLog
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
    TransportError,
    UsageError,
)
from gpubot.services.approvals import ApprovalService, Identity, plan_of, unix
from gpubot.services.reset import ResetResult
from gpubot.services.reset_run import EventSink, ResetEvent
from gpubot.services.status import FleetStatus, StatusService

log = logging.getLogger(__name__)

# Refused for who the person is, not for the state of a request: these are audited.
WHO_REFUSALS = (NotPermitted, NotAnApprover, SelfApproval, ApproversUnknown)

Sweeper = Callable[[Identity], Awaitable[Message]]
# GPU-hours each owner holds idle now, for these snapshots (``SweepService.idle_gpu_hours``).
IdleHours = Callable[[Sequence[NodeSnapshot]], Awaitable[Mapping[str, float]]]


@dataclass
class Services:
    """What the chat front ends call: the same services as the CLI."""

    settings: Settings
    policy: Policy
    status: StatusService
    approvals: ApprovalService | None  # None: no audit store, so no resets (fail closed)
    audit: AuditLog | None  # None: no audit store
    sweep: Sweeper | None = None
    idle: IdleHours | None = None  # GPU-hours held idle (``SweepService.idle_gpu_hours``)


def error_message(exc: BaseException) -> Message:
    """Render an error for a person, one line."""
    if isinstance(exc, UsageError):
        return render_text(f"⚠ {mrkdwn(str(exc))}")
    if isinstance(exc, NotPermitted | ApprovalError):
        return render_text(f"⛔ {mrkdwn(str(exc))}")
    if isinstance(exc, StoreError):
        return render_text(
            f"🛑 The audit log is unavailable, so nothing was done: {mrkdwn(str(exc))}"
        )
    if isinstance(exc, TransportError):
        return render_text(f"📡 {mrkdwn(str(exc))}")
    if isinstance(exc, GpubotError):
        return render_text(f"⚠ {mrkdwn(str(exc))}")
    return render_text("💥 Internal error: the details are in gpubot's log")


class Flows:
    """Runs parsed ``/gpu`` commands for one front end (``source``: "slack", "console")."""

    def __init__(self, svc: Services, *, source: str, min_update_s: float = MIN_UPDATE_S) -> None:
        self.svc = svc
        self.source = source
        self.min_update_s = min_update_s
        self.waiting: dict[int, Handle | None] = {}  # approval id → the requester's message
        self.deciding: set[int] = set()  # approvals being decided now (double clicks)
        self._home: tuple[float, FleetStatus] | None = None
        self.renders = FleetRenders()

    def check(self, cmd: commands.Command) -> None:
        """Check names against the inventory (pure and fast: before acknowledging)."""
        if isinstance(cmd, commands.Status):
            self.svc.status.resolve(cmd.names)
        elif isinstance(cmd, commands.Reset | commands.GpuReset):
            self.svc.status.node(cmd.node)

    async def run(self, cmd: commands.Command, who: Identity, out: Surface, *, text: str) -> None:
        """Run one command to its end; errors become messages."""
        try:
            if who.refused is not None and not isinstance(cmd, commands.Help):
                await self.refuse(who, out, IdentityRefused(who.refused), action=_action(cmd),
                                  command=text, node=getattr(cmd, "node", None))  # fmt: skip
            elif isinstance(cmd, commands.Help):
                await out.reply(
                    render_text(mrkdwn_lines(commands.help_text(cmd.topic)), title="/gpu")
                )
            elif isinstance(cmd, commands.Status):
                await self.status(cmd, who, out)
            elif isinstance(cmd, commands.Reset):
                await self.reset(cmd, who, out, text=text)
            elif isinstance(cmd, commands.GpuReset):
                await self.gpu_reset(cmd, who, out, text=text)
            elif isinstance(cmd, commands.Audit):
                await self.audit(cmd, out)
            elif isinstance(cmd, commands.Sweep):
                await self.sweep(who, out)
            elif isinstance(cmd, commands.Decide):
                await self.decide(cmd.approval_id, cmd.approve, who, out, handle=None)
        except GpubotError as exc:
            await out.reply(error_message(exc))
        except Exception as exc:
            log.exception("command %r by %s failed", text, who.id)
            await out.reply(error_message(exc))

    async def status(self, cmd: commands.Status, who: Identity, out: Surface) -> None:
        """Answer ``status``: one node in full, a few nodes each, a fleet in summary."""
        nodes = self.svc.status.resolve(cmd.names)
        handle = await out.post(render_text(f"⏳ asking {len(nodes)} node(s) …"))
        try:
            fleet = await self.svc.status.fleet(
                cmd.names or ("all",), actor=who.id, source=self.source
            )
        except GpubotError as exc:
            await out.update(handle, error_message(exc))
            return
        title = "GPU status · " + (", ".join(cmd.names) if cmd.names else "all")
        await out.update(handle, self.renders.fleet(fleet, title))  # once per shared answer

    async def reset(self, cmd: commands.Reset, who: Identity, out: Surface, *, text: str) -> None:
        """Plan; run at once if only the asker's processes die, else ask for approval."""
        approvals = await self._permitted(who, out, "reset", text, cmd.node)
        if approvals is None:
            return
        handle = await out.post(render_text(f"⏳ planning a reset of *{escape(cmd.node)}* …"))
        try:
            plan, before = await approvals.plan(who, cmd)
        except GpubotError as exc:
            await out.update(handle, error_message(exc))
            return
        title = f"Reset {plan.node} · GPU {', '.join(map(str, plan.gpus)) or '–'}"
        asked = f"Requested by <@{who.id}>"
        floor = floor_note(plan, who.linux_user, self.svc.policy.min_uid) if plan.forced else None
        if floor is not None:  # refused as self-service; on-call may still approve it
            await self.refuse(who, out, NotPermitted(floor), action="reset", command=text,
                              node=plan.node)  # fmt: skip
        if not plan.forced:
            await self._execute(
                out, handle, title, asked, plan,
                lambda sink: approvals.run(who, plan, before, grace_s=cmd.grace_s,
                                           command=text, source=self.source, on_event=sink),
            )  # fmt: skip
            return
        try:
            approval = await approvals.open(
                who, plan, grace_s=cmd.grace_s, command=text, source=self.source
            )
        except GpubotError as exc:
            await out.update(handle, error_message(exc))
            return
        expires = unix(approval.expires_at) or 0.0
        request = render_approval_request(approval.id, plan, who.id, who.linux_user, expires)
        where = await out.post(request, channel=self.svc.policy.approval_channel)
        note = None
        if where is not None:
            await self._remember(approval.id, where)
        elif self.source == "slack":
            note = (
                "⚠ The request could not be posted for the approvers; one can still decide it "
                f"with `gpubot console --as THEIR_ID`, then `approve {approval.id}`."
            )
        waiting = render_approval_state(
            approval.id, plan, who.id, who.linux_user, state="pending", by=None, at=expires,
            note=note,
        )  # fmt: skip
        self.waiting[approval.id] = await out.update(handle, waiting)

    async def gpu_reset(
        self, cmd: commands.GpuReset, who: Identity, out: Surface, *, text: str
    ) -> None:
        """Reset one idle GPU whose memory leaked."""
        approvals = await self._permitted(who, out, "gpu-reset", text, cmd.node)
        if approvals is None:
            return
        handle = await out.post(render_text(f"⏳ resetting {escape(cmd.node)} GPU {cmd.gpu} …"))
        await self._execute(
            out, handle, f"GPU reset {cmd.node} · GPU {cmd.gpu}", f"Requested by <@{who.id}>",
            None,
            lambda sink: approvals.reset.gpu_reset(cmd.node, cmd.gpu, actor=who.id,
                                                   source=self.source, command=text,
                                                   on_event=sink),
        )  # fmt: skip

    async def audit(self, cmd: commands.Audit, out: Surface) -> None:
        """Show the latest actions."""
        if self.svc.audit is None:
            raise StoreError("the audit log is unavailable")
        actions = await self.svc.audit.actions(node=cmd.node, limit=cmd.limit)
        await out.reply(render_audit(actions, node=cmd.node))

    async def sweep(self, who: Identity, out: Surface) -> None:
        """Sweep the fleet now, if this gpubot sweeps."""
        if self.svc.sweep is None:
            await out.reply(render_text("Sweeps are not set up in this gpubot."))
            return
        handle = await out.post(render_text("⏳ sweeping …"))
        await out.update(handle, await self.svc.sweep(who))

    # -- approvals -------------------------------------------------------------------------

    async def decide(
        self, approval_id: int, approve: bool, who: Identity, out: Surface, *,
        handle: Handle | None,
    ) -> None:  # fmt: skip
        """Approve or deny a forced kill; an approval runs the plan once and reports here."""
        approvals = self._approvals()
        verb = "approve" if approve else "deny"
        if approval_id in self.deciding:
            await self._in_flight(approvals, approval_id, approve, who, out)
            return
        self.deciding.add(approval_id)
        try:
            try:
                approval = await approvals.decide(approval_id, who, approve, source=self.source)
            except WHO_REFUSALS as exc:
                await self.refuse(who, out, exc, action=verb, command=f"{verb} {approval_id}",
                                  node=await _node_of(approvals, approval_id))  # fmt: skip
                return
            except ApprovalExpired as exc:
                await out.reply(error_message(exc))
                expired = await approvals.approvals.get(approval_id)
                if expired is not None:
                    await self._show_final(out, expired, handle)
                return
            except (ApprovalError, StoreError) as exc:
                await out.reply(error_message(exc))
                return
            handle = handle or _where(approval)
            plan = plan_of(approval)
            frame = _framer(approval, plan)
            handle = await out.update(handle, frame(None))
            mine = self.waiting.pop(approval_id, None)
            if approval.state is not ApprovalState.APPROVED:
                if mine is not None:
                    await out.update(mine, frame(None))
                return
            if mine is not None:
                await out.update(mine, frame(render_text("⏳ running …")))
            title = f"Reset {plan.node} · GPU {', '.join(map(str, plan.gpus))}"
            asked = f"Requested by <@{approval.requester}>, approved by <@{who.id}>"
            _, result = await self._execute(
                out, handle, title, asked, plan,
                lambda sink: approvals.execute(approval, source=self.source, on_event=sink),
                frame=frame,
            )  # fmt: skip
            if mine is not None:
                failed = render_text("⚠ the reset failed: see the on-call channel")
                body = render_result(title, asked, result) if result is not None else failed
                await out.update(mine, frame(body))
        finally:
            self.deciding.discard(approval_id)

    async def _in_flight(
        self, approvals: ApprovalService, approval_id: int, approve: bool, who: Identity,
        out: Surface,
    ) -> None:  # fmt: skip
        """Answer a click while someone's decision of the same request is in flight: one who
        may not decide is still refused and audited as such; a legitimate one is told to wait."""
        verb = "approve" if approve else "deny"
        try:
            await approvals.check_decision(approval_id, who, approve)
        except WHO_REFUSALS as exc:
            await self.refuse(who, out, exc, action=verb, command=f"{verb} {approval_id}",
                              node=await _node_of(approvals, approval_id))  # fmt: skip
            return
        except (ApprovalError, StoreError):
            pass
        await out.reply(render_text(f"⏳ Request #{approval_id} is being decided already."))

    async def expire(self, out: Surface) -> int:
        """Expire requests whose time is up and show it on their messages."""
        if self.svc.approvals is None:
            return 0
        expired = await self.svc.approvals.expire_due()
        for a in expired:
            await self._show_final(out, a, None)
        return len(expired)

    async def refuse(
        self, who: Identity, out: Surface, exc: GpubotError, *, action: str, command: str,
        node: str | None,
    ) -> None:  # fmt: skip
        """Tell the person why they are refused (only them), and audit who tried what."""
        await out.reply(error_message(exc))
        if self.svc.approvals is not None:
            await self.svc.approvals.record_refusal(
                who, action=action, command=command, node=node, reason=str(exc),
                source=self.source,
            )  # fmt: skip

    async def _show_final(self, out: Surface, a: Approval, handle: Handle | None) -> None:
        msg = _framer(a, plan_of(a))(None)
        where = handle or _where(a)
        if where is not None:
            await out.update(where, msg)
        mine = self.waiting.pop(a.id, None)
        if mine is not None:
            await out.update(mine, msg)

    async def _remember(self, approval_id: int, where: Handle) -> None:
        try:
            await self._approvals().approvals.set_message(approval_id, *where)
        except StoreError as exc:  # the request still works from its buttons
            log.warning("approval %s: cannot remember its message: %s", approval_id, exc)

    async def _permitted(
        self, who: Identity, out: Surface, action: str, text: str, node: str
    ) -> ApprovalService | None:
        """Return the approvals service if ``who`` may reset on ``node``; else say why (and
        audit the refusal) and return None."""
        approvals = self._approvals()
        try:
            await approvals.check_may_reset(who, node)
        except NotPermitted as exc:
            await self.refuse(who, out, exc, action=action, command=text, node=node)
            return None
        return approvals

    def _approvals(self) -> ApprovalService:
        if self.svc.approvals is None:
            raise StoreError("resets need the audit log, which could not be opened")
        return self.svc.approvals

    # -- running with progress -------------------------------------------------------------

    async def _execute(
        self,
        out: Surface,
        handle: Handle | None,
        title: str,
        asked: str,
        plan: ResetPlan | None,
        start: Callable[[EventSink], Awaitable[ResetResult]],
        *,
        frame: Callable[[Message | None], Message] | None = None,
    ) -> tuple[Handle | None, ResetResult | None]:
        """Run a reset, updating ``handle`` as events arrive; end with the result or error."""
        wrap = frame or (lambda m: m or render_text(""))
        events: list[ResetEvent] = []
        progress = Progress(
            out, handle, lambda: wrap(render_progress(title, asked, plan, events)),
            self.min_update_s,
        )  # fmt: skip

        async def sink(event: ResetEvent) -> None:
            events.append(event)
            progress.poke()

        try:
            result = await start(sink)
        except GpubotError as exc:
            where = await progress.stop()
            return await out.update(where, wrap(error_message(exc))), None
        except BaseException:
            await progress.stop()
            raise
        where = await progress.stop()
        return await out.update(where, wrap(render_result(title, asked, result))), result

    # -- home ------------------------------------------------------------------------------

    async def home(self, who: Identity, *, max_age_s: float = 15.0) -> dict[str, Any]:
        """Return the Home tab for ``who`` (fleet answers shared for ``max_age_s``)."""
        now = time.time()
        if who.refused is not None:
            return render_refused_home(who.id, who.refused, now=now)
        if self._home is None or now - self._home[0] > max_age_s:
            fleet = await self.svc.status.fleet(("all",), actor=who.id, source=self.source)
            self._home = (now, fleet)
        fleet = self._home[1]
        idle: Mapping[str, float] | None = None
        if self.svc.idle is not None:
            try:
                idle = await self.svc.idle(fleet.snapshots)
            except GpubotError as exc:  # the tab still shows the fleet
                log.warning("idle GPU-hours unavailable for the Home tab: %s", exc)
        cut = await interrupted_for(self.svc.audit, self.svc.approvals, who)
        return render_home(who.id, who.linux_user, fleet.snapshots, fleet.failed, interrupted=cut,
                           seconds=fleet.seconds, now=now, idle_hours=idle)  # fmt: skip


def _action(cmd: commands.Command) -> str:
    """Return what a command tries to do, as the audit log names it."""
    if isinstance(cmd, commands.Decide):
        return "approve" if cmd.approve else "deny"
    if isinstance(cmd, commands.GpuReset):
        return "gpu-reset"
    return type(cmd).__name__.lower()


async def _node_of(approvals: ApprovalService, approval_id: int) -> str | None:
    """Return the node an approval is about, if it can be read (for the audit record)."""
    try:
        found = await approvals.approvals.get(approval_id)
    except StoreError:
        return None
    return None if found is None else found.node


def _where(a: Approval) -> Handle | None:
    return (a.channel, a.message_ts) if a.channel and a.message_ts else None


def _framer(a: Approval, plan: ResetPlan) -> Callable[[Message | None], Message]:
    """Return a function that wraps a body in the approval's header and decision line."""
    user = a.request.requester_user
    at = unix(a.decided_at) if a.state is not ApprovalState.EXPIRED else unix(a.expires_at)

    def frame(body: Message | None) -> Message:
        return render_approval_state(
            a.id, plan, a.requester, user,
            state=str(a.state), by=a.decided_by, at=at, body=body,
        )  # fmt: skip

    return frame
