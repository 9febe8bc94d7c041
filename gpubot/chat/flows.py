"""Chat flows shared by every front end: validate → call a service → render → post/update, on
the front end's ``Surface``. Flows never raise: every error becomes a message.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.chat.claims import CLAIM_COMMANDS, ClaimDesk, Dm, no_dm, with_claims
from gpubot.chat.diag_view import run_diag
from gpubot.chat.drain_view import render_drain, show_change
from gpubot.chat.errors import error_message
from gpubot.chat.fleet_view import FleetRenders
from gpubot.chat.home import render_home, render_refused_home, with_week, with_windows
from gpubot.chat.interrupted import interrupted_for
from gpubot.chat.layout import FEW_NODES
from gpubot.chat.maint_view import live_windows, maint_answer
from gpubot.chat.message import Mention, Message, Section, Text, bold, note, paragraph
from gpubot.chat.report_view import render_usage
from gpubot.chat.request_view import render_request, render_request_state, request_framer
from gpubot.chat.reset_view import Decision, render_audit, render_result
from gpubot.chat.surface import MIN_UPDATE_S, MessageRef, Surface
from gpubot.chat.tracking import Pace, Tracker, reset_title
from gpubot.config import Settings
from gpubot.core import commands, durations
from gpubot.core import maint as mc
from gpubot.core.alerting import Delivery
from gpubot.core.approval.model import Approval, cannot_run
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.models import ApprovalState, NodeSnapshot
from gpubot.core.policy import Person, Policy
from gpubot.core.ports import AuditLog, Clock
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import GpubotError, IdentityRefused, StoreError
from gpubot.services.approval_duty import ApprovalDuty
from gpubot.services.approvals import ApprovalService, unix
from gpubot.services.claims import ClaimService
from gpubot.services.drain import slurm_node_of
from gpubot.services.ladder import ReclaimLadder
from gpubot.services.maint import MaintService
from gpubot.services.requests import (
    Announce,
    Busy,
    Changed,
    Decided,
    Done,
    Expired,
    Failed,
    Pending,
    Refusal,
    RequestEvent,
    RequestService,
)
from gpubot.services.reset import Ask
from gpubot.services.status import FleetStatus, StatusService
from gpubot.services.usage import UsageService

__all__ = ["Flows", "Services", "help_message"]

log = logging.getLogger(__name__)

# A read-only sweep now, audited as asked by this person from this front end ("console", …).
Sweeper = Callable[[Person, str], Awaitable[Message]]
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
    requests: RequestService  # plan → permission → approval → execute
    sweep: Sweeper | None = None
    idle: IdleHours | None = None  # GPU-hours held idle (``SweepService.idle_gpu_hours``)
    duty: ApprovalDuty[Message] | None = None  # re-pings and tells, with a front end's outbox
    usage: UsageService | None = None  # GPU-hours reports
    ladder: ReclaimLadder | None = None  # the reclaim ladder of idle holders
    claims: ClaimService | None = None  # claims and the queue (None: no audit store)
    maint: MaintService | None = None  # maintenance windows (None: no audit store)


def help_message(text: str) -> Message:
    """Return the help text (each line a core sentence: its commands shown as code)."""
    return Message("/gpu", (Section(paragraph(text)),))


class Flows:
    """Runs parsed ``/gpu`` commands for one front end (``source``: its name, as audited)."""

    def __init__(
        self,
        svc: Services,
        *,
        source: str,
        min_update_s: float = MIN_UPDATE_S,
        clock: Clock = SYSTEM_CLOCK,
        dm: Dm = no_dm,
    ) -> None:
        """``dm``: how the front end tells one person (the claims' duty)."""
        self.svc = svc
        self.source = source
        self.min_update_s = min_update_s
        self.clock = clock
        self.requests = svc.requests
        self.waiting: dict[int, MessageRef | None] = {}  # approval id → the requester's message
        self.duty = svc.duty  # with a front end that posts once
        self._home: tuple[float, FleetStatus] | None = None
        self.renders = FleetRenders()
        self.claims = ClaimDesk(svc.claims, source=source, dm=dm, reset=self.reset)

    def check(self, cmd: commands.Command) -> None:
        """Check names against the inventory (pure and fast: before acknowledging)."""
        if isinstance(cmd, commands.Status):
            self.svc.status.resolve(cmd.names)
        elif isinstance(cmd, commands.Reset | commands.GpuReset | commands.Diag):
            self.svc.status.node(cmd.node)
        elif isinstance(cmd, commands.Drain | commands.Resume):
            slurm_node_of(self.svc.status.node(cmd.node))

    async def run(self, cmd: commands.Command, who: Person, out: Surface, *, text: str) -> None:
        """Run one command to its end; errors become messages."""
        try:
            if who.refused is not None and not isinstance(cmd, commands.Help):
                # Only the person is told why; who tried what is audited.
                refused, node = IdentityRefused(who.refused), getattr(cmd, "node", None)
                track = self.tracker(out, ())
                await self.requests.refuse(
                    self.ask(who, text), refused, track, action=_action(cmd), node=node
                )
            elif isinstance(cmd, commands.Help):
                await out.reply(help_message(commands.help_text(cmd.topic)))
            elif isinstance(cmd, commands.Status):
                await self.status(cmd, who, out)
            elif isinstance(cmd, commands.Reset):
                await self.reset(cmd, who, out, text=text)
            elif isinstance(cmd, commands.GpuReset):
                await self.gpu_reset(cmd, who, out, text=text)
            elif isinstance(cmd, commands.Diag):
                await run_diag(self.requests, self.svc.settings, self.ask(who, text), cmd, out)
            elif isinstance(cmd, commands.Drain | commands.Resume):
                await self.slurm_state(cmd, who, out, text=text)
            elif isinstance(cmd, commands.Audit):
                await self.audit(cmd, out)
            elif isinstance(cmd, commands.Sweep):
                await self.sweep(who, out)
            elif isinstance(cmd, commands.Report):
                await self.report(cmd, out)
            elif isinstance(cmd, commands.Decide):
                await self.decide(cmd.approval_id, cmd.approve, who, out, handle=None)
            elif isinstance(cmd, CLAIM_COMMANDS):
                await self.claims.run(cmd, who, out)
            elif isinstance(cmd, mc.MaintOpen | mc.MaintEnd | mc.MaintList):
                now = self.clock.now()
                await out.reply(
                    await maint_answer(self.svc.maint, cmd, who, self.source, now, text)
                )
        except GpubotError as exc:
            await out.reply(error_message(exc))
        except Exception as exc:
            log.exception("command %r by %s failed", text, who.id)
            await out.reply(error_message(exc))

    async def status(self, cmd: commands.Status, who: Person, out: Surface) -> None:
        """Answer ``status``: one node in full, a few nodes each, a fleet in summary: above
        ``FEW_NODES`` the CLI's ``status --summary`` (``StatusService.summary``: the nodes whose
        telemetry is "prometheus" from there, the rest and any it cannot vouch for by SSH)."""
        nodes = self.svc.status.resolve(cmd.names)
        handle = await out.post(note(f"⏳ asking {len(nodes)} node(s) …"))
        svc = self.svc.status
        read = svc.summary if len(nodes) > FEW_NODES else svc.fleet
        try:
            fleet = await read(cmd.names or ("all",), actor=who.id, source=self.source)
        except GpubotError as exc:
            await out.update(handle, error_message(exc))
            return
        title = "GPU status · " + (", ".join(cmd.names) if cmd.names else "all")
        msg = self.renders.fleet(fleet, title)  # once per shared answer
        shown = [s.node for s in fleet.snapshots] + [n.node for n in fleet.telemetry]
        await out.update(handle, await with_claims(self.claims, msg, shown))

    def ask(self, who: Person, text: str) -> Ask:
        return Ask(who, text, self.source)

    def tracker(self, out: Surface, asked: Text, **kw: Any) -> Tracker:
        return Tracker(out, Pace(self.min_update_s, self.clock), asked=asked, **kw)

    async def reset(
        self, cmd: commands.Reset, who: Person, out: Surface, *, text: str, context: Text = ()
    ) -> None:
        """Plan; run at once if only the asker's processes die, else ask for approval
        (``context``: shown to the approvers: the claim an intruder uses, the idle evidence)."""
        planning = note("⏳ planning a reset of ", bold(cmd.node), " …")
        track = self.tracker(out, ("Requested by ", Mention(who.id)), planning=planning)
        unconfirmed: set[int] = set()
        announce = self._announcer(who, out, context, unconfirmed)
        outcome = await self.requests.reset(self.ask(who, text), cmd, track, announce)
        if not isinstance(outcome, Pending):
            await track.end(outcome)
            return
        await self._pending(outcome, who, out, track.handle, unconfirmed)

    def _announcer(
        self, who: Person, out: Surface, context: Text, unconfirmed: set[int]
    ) -> Announce:
        """Return how a request of ``who`` is posted for the approvers (``unconfirmed``: the
        ids whose post the chat service did not confirm)."""

        async def announce(approval: Approval, plan: ResetPlan | NodeChange) -> MessageRef | None:
            expires = unix(approval.expires_at) or 0.0
            msg = render_request(
                approval.id, plan, who.id, who.linux_user, expires, context=context
            )
            channel = self.svc.policy.approval_channel
            if self.duty is not None and channel is not None:  # recorded, then posted once
                sent = await self.duty.announce(approval, msg, channel)
                if sent is not None and sent.delivery is Delivery.UNCERTAIN:
                    unconfirmed.add(approval.id)
                return None if sent is None else sent.ref
            return await out.post(msg, channel=channel)

        return announce

    async def _pending(
        self, outcome: Pending, who: Person, out: Surface, at: MessageRef | None, sent: set[int]
    ) -> None:
        """Show the requester their request waiting for an approver (``at``: in place of that
        message, if any; ``sent``: the ids whose post the chat service did not confirm)."""
        warning = None
        if outcome.approval.id in sent:
            warning = (
                "⏳ The chat service did not confirm the request's post to the approvers: gpubot "
                "looks for it and posts it again if it is missing."
            )
        elif not outcome.posted and self.duty is not None:  # a front end that posts requests
            warning = (
                "⚠ The request could not be posted for the approvers; one can still decide it "
                f"with `gpubot console --as THEIR_ID`, then `approve {outcome.approval.id}`."
            )
        a, expires = outcome.approval, unix(outcome.approval.expires_at) or 0.0
        waiting = render_request_state(
            a.id,
            outcome.plan,
            who.id,
            who.linux_user,
            Decision("pending", None, expires),
            note=warning,
        )
        self.waiting[a.id] = await out.update(at, waiting)

    async def gpu_reset(
        self, cmd: commands.GpuReset, who: Person, out: Surface, *, text: str
    ) -> None:
        """Reset one idle GPU whose memory leaked."""
        track = self.tracker(
            out,
            ("Requested by ", Mention(who.id)),
            planning=note(f"⏳ resetting {cmd.node} GPU {cmd.gpu} …"),
            title=f"GPU reset {cmd.node} · GPU {cmd.gpu}",
        )
        await track.end(await self.requests.gpu_reset(self.ask(who, text), cmd, track))

    async def slurm_state(
        self, cmd: commands.Drain | commands.Resume, who: Person, out: Surface, *, text: str
    ) -> None:
        """Drain or resume a Slurm node: ``change_slurm`` with no context for the approvers."""
        await self.change_slurm(cmd, who, out, text=text)

    async def change_slurm(
        self,
        cmd: commands.Drain | commands.Resume,
        who: Person,
        out: Surface,
        *,
        text: str,
        context: Text = (),
    ) -> None:
        """``slurm_state``, with ``context`` shown to the approvers (the finding it is for)."""
        refusals: list[GpubotError] = []

        async def sink(event: RequestEvent) -> None:
            if isinstance(event, Refusal):
                refusals.append(event.error)

        unconfirmed: set[int] = set()
        announce = self._announcer(who, out, context, unconfirmed)
        outcome = await self.requests.slurm_state(self.ask(who, text), cmd, sink, announce)
        if isinstance(outcome, Pending):
            await self._pending(outcome, who, out, None, unconfirmed)
        elif isinstance(outcome, Changed):
            await out.reply(render_drain(outcome.result, who.id))
        elif isinstance(outcome, Failed):
            await out.reply(error_message(outcome.error))
        elif refusals:
            await out.reply(error_message(refusals[0]))

    async def audit(self, cmd: commands.Audit, out: Surface) -> None:
        if self.svc.audit is None:
            raise StoreError("the audit log is unavailable")
        actions = await self.svc.audit.actions(node=cmd.node, limit=cmd.limit)
        await out.reply(render_audit(actions, node=cmd.node))

    async def sweep(self, who: Person, out: Surface) -> None:
        """Sweep the fleet now, if this gpubot sweeps."""
        if self.svc.sweep is None:
            await out.reply(note("Sweeps are not set up in this gpubot."))
            return
        handle = await out.post(note("⏳ sweeping …"))
        await out.update(handle, await self.svc.sweep(who, self.source))

    async def report(self, cmd: commands.Report, out: Surface) -> None:
        """Show GPU-hours over the last ``cmd.since`` (the CSV is the CLI's)."""
        if self.svc.usage is None:
            raise StoreError("GPU-hours need the database, which is unavailable")
        report = await self.svc.usage.last(durations.parse(cmd.since), by=cmd.by)
        await out.reply(render_usage(report))

    # -- approvals -------------------------------------------------------------------------

    async def decide(
        self,
        approval_id: int,
        approve: bool,
        who: Person,
        out: Surface,
        *,
        handle: MessageRef | None,
    ) -> None:
        """Approve or deny a forced kill; an approval runs the plan once and reports here."""
        verb = "approve" if approve else "deny"
        track = self.tracker(out, (), handle=handle, on_decided=self._decided)
        ask = self.ask(who, f"{verb} {approval_id}")
        outcome = await self.requests.decide(approval_id, approve, ask, track)
        if isinstance(outcome, Busy):
            await out.reply(note(f"⏳ Request #{approval_id} is being decided already."))
        elif isinstance(outcome, Expired):
            await out.reply(error_message(outcome.error))
            if outcome.approval is not None:
                await self._show_final(out, outcome.approval, handle)
        elif isinstance(outcome, Changed) or (
            isinstance(outcome, Failed) and outcome.approval and outcome.approval.request.change
        ):
            await show_change(track, outcome, self.waiting)
        elif isinstance(outcome, Failed) and track.progress is None:
            await out.reply(error_message(outcome.error))
        elif isinstance(outcome, Done | Failed):
            result = await track.end(outcome)
            mine = self.waiting.pop(approval_id, None)
            if mine is not None:
                failed = note("⚠ the reset failed: see the on-call channel")
                if isinstance(outcome, Failed) and cannot_run(outcome.error) is not None:
                    failed = note(f"⏳ not run yet ({outcome.error}): retried, see the thread")
                done = render_result(track.title or "", track.asked, result) if result else failed
                await out.update(mine, track.frame(done))

    async def _decided(self, track: Tracker, event: Decided) -> None:
        """Show a decision on the request's message and the requester's own."""
        a, plan = event.approval, event.plan
        track.frame = request_framer(a)
        track.handle = await track.out.update(track.handle or a.ref, track.frame(None))
        mine = self.waiting.get(a.id)
        if a.state is not ApprovalState.APPROVED:
            self.waiting.pop(a.id, None)
            if mine is not None:
                await track.out.update(mine, track.frame(None))
            return
        if mine is not None:
            await track.out.update(mine, track.frame(note("⏳ running …")))
        if isinstance(plan, ResetPlan):
            track.title = reset_title(plan)
        track.asked = (
            "Requested by ",
            Mention(a.requester),
            ", approved by ",
            Mention(a.decided_by or "?"),
        )

    async def expire(self, out: Surface) -> int:
        """The approval duty: settle lost posts, re-ping, expire due requests (telling their
        requesters), then look again at approved actions that did not run to an end. Each of
        this front end's requests only: another's are its own duty's to show and tell."""
        if self.duty is not None:
            await self.duty.settle()
            await self.duty.reping()
        expired = await self.requests.expire_due(self.source)
        for a in expired:
            await self._show_final(out, a, None)
            if self.duty is not None and not await self.duty.tell_requester(a):
                log.info("approval %s expired: its requester had no direct message", a.id)
        for a in [] if self.duty is None else await self.duty.look_again():
            await self._show_final(out, a, None)
        return len(expired)

    async def _show_final(self, out: Surface, a: Approval, handle: MessageRef | None) -> None:
        msg = request_framer(a)(None)
        where = handle or a.ref
        if where is not None:
            await out.update(where, msg)
        mine = self.waiting.pop(a.id, None)
        if mine is not None:
            await out.update(mine, msg)

    # -- home ------------------------------------------------------------------------------

    async def home(self, who: Person, *, max_age_s: float = 15.0) -> Message:
        """Return the Home tab for ``who`` (fleet answers shared for ``max_age_s``)."""
        now = self.clock.now()
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
        usage, mine = self.svc.usage, who.linux_user
        week = None if usage is None or mine is None else await usage.personal(mine)
        page = render_home(
            who.id,
            who.linux_user,
            fleet.snapshots,
            fleet.failed,
            interrupted=cut,
            seconds=fleet.seconds,
            now=now,
            idle_hours=idle,
        )
        page = with_windows(with_week(page, week), await live_windows(self.svc.maint), now)
        return await with_claims(self.claims, page, None, mine=who.id)


def _action(cmd: commands.Command) -> str:
    """Return what a command tries to do, as the audit log names it."""
    if isinstance(cmd, commands.Decide):
        return "approve" if cmd.approve else "deny"
    return "gpu-reset" if isinstance(cmd, commands.GpuReset) else type(cmd).__name__.lower()
