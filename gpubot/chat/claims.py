"""The claim and queue commands' flows, for every front end. The duty (``tick``) tells what it
finds by direct message through the front end's ``dm``; buttons run the typed commands' flows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from gpubot.chat import claim_view as view
from gpubot.chat.errors import error_message
from gpubot.chat.message import Message, Section, Text, bold, lines, note
from gpubot.chat.surface import Surface
from gpubot.core import commands
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import Claim, ClaimState, Conflict, Granted, OverLimit
from gpubot.core.maint import Ahead, ProcsAhead
from gpubot.core.policy import Person
from gpubot.errors import DUTY_TURN, GpubotError, StoreError, UsageError
from gpubot.services.claims import (
    ClaimService,
    Ended,
    Event,
    IdleAsked,
    IdleReleased,
    Intruding,
    Offered,
)
from gpubot.services.status import StatusService

log = logging.getLogger(__name__)

# chat user id, message, the DM's own name (the outbox's subject: one DM, sent once) → known
# delivered (False: not, or not yet; the duty asks again for a live hold)
Dm = Callable[[str, Message, str], Awaitable[bool]]
Reset = Callable[..., Awaitable[None]]  # ``Flows.reset``: (cmd, who, out, text=, context=)
CLAIM_COMMANDS = cc.ClaimCommand  # for isinstance
NO_STORE = "claims and the queue need the audit database, which is unavailable"


async def holds(status: StatusService, node: str, pid: int, ticks: int | None, gpu: int) -> bool:
    """Whether that process holds the GPU now, asked of the node: one that ended, or a pid that
    is another process now (its start ticks differ), is never reset on a button's word."""
    snap = await status.snapshot(status.node(node))
    return any((p.pid, p.start_ticks, p.gpu_index) == (pid, ticks, gpu) for p in snap.processes)


async def no_dm(user: str, msg: Message, subject: str) -> bool:
    """Tell no one (a front end without direct messages): logged."""
    log.info("not told %s: %s", user, msg.fallback or msg.title)
    return False


class ClaimDesk:
    """Runs claim and queue commands for one front end (``source``)."""

    def __init__(
        self,
        service: ClaimService | None,
        *,
        source: str,
        dm: Dm = no_dm,
        reset: Reset | None = None,
    ) -> None:
        self.service = service
        self.source = source
        self.dm = dm
        self.reset = reset  # an intruder's "Free it": the claimant's reset (``Flows.reset``)

    def _svc(self) -> ClaimService:
        if self.service is None:
            raise StoreError(NO_STORE)
        return self.service

    async def run(self, cmd: cc.ClaimCommand, who: Person, out: Surface) -> None:
        """Run one claim or queue command; errors become one-line messages."""
        try:
            await out.reply(await self.answer(cmd, who))
        except GpubotError as exc:
            await out.reply(error_message(exc))

    async def answer(self, cmd: cc.ClaimCommand, who: Person) -> Message:
        """Return the message that answers ``cmd`` (raises ``GpubotError``)."""
        svc = self._svc()
        now = svc.clock.now()
        if isinstance(cmd, cc.ClaimGpus | cc.Take):
            return await self._claim(svc, cmd, who)
        if isinstance(cmd, cc.Extend):
            return view.render_extended(await svc.extend(who, cmd, self.source))
        if isinstance(cmd, cc.Release):
            gone = await svc.release(who, cmd, self.source)
            await self._serve_now(svc, gone, now)
            return view.render_ended(gone, "released")
        if isinstance(cmd, cc.ListClaims):
            return view.render_claims(await svc.claims(who, cmd), cmd.scope, now)
        if isinstance(cmd, cc.WaitFor):
            w, ahead = await svc.wait(who, cmd, self.source)
            return view.render_queued(w, ahead)
        if isinstance(cmd, cc.Queue):
            return view.render_queue(await svc.queue(cmd.node), cmd.node)
        left = await svc.leave(who, cmd.wait_id, self.source)
        return note(f"✅ left the queue: place {', '.join(str(w.id) for w in left)}")

    async def _claim(self, svc: ClaimService, cmd: cc.ClaimGpus | cc.Take, who: Person) -> Message:
        if isinstance(cmd, cc.Take):
            got = await svc.take(who, cmd.wait_id, self.source)
            node, wait = "", ""
        else:
            got = await svc.claim(who, cmd, self.source)
            node, wait = cmd.node, view.wait_command(cmd)
        if isinstance(got, Granted):
            return view.render_granted(got.claims)
        if isinstance(got, OverLimit):
            raise UsageError(f"not claimed: {got.text()}")
        if isinstance(got, Conflict) and wait:
            return view.render_conflict(got, node, wait)
        raise UsageError("not claimed: those GPUs are taken")

    async def click(self, action: str, value: str, who: Person, out: Surface) -> None:
        """Run a button of a claim or queue message (Claim, Leave, Queue me)."""
        if who.refused is not None:
            await out.reply(error_message(UsageError(who.refused)))
            return
        try:
            if action == view.ACTION_TAKE:
                cmd: cc.ClaimCommand = cc.Take(int(value))
            elif action == view.ACTION_LEAVE:
                cmd = cc.Leave(int(value))
            elif action in (view.ACTION_KEEP, view.ACTION_RELEASE):
                claim_id = int(value.split(" ", 1)[0])  # Release's "ID NODE GPU": the id
            elif action == view.ACTION_JOIN:
                parsed = commands.parse(value)
                if not isinstance(parsed, cc.WaitFor):
                    raise UsageError("this button queues for nothing")
                cmd = parsed
            else:
                raise UsageError(f"unknown button {action!r}")
        except GpubotError as exc:  # before ValueError: a UsageError is one too
            await out.reply(error_message(exc))
            return
        except ValueError:
            await out.reply(error_message(UsageError(f"a button with a bad value {value!r}")))
            return
        if action in (view.ACTION_KEEP, view.ACTION_RELEASE):
            try:
                await self._idle_click(action, claim_id, who, out)
            except GpubotError as exc:
                await out.reply(error_message(exc))
            return
        await self.run(cmd, who, out)

    async def _idle_click(self, action: str, claim_id: int, who: Person, out: Surface) -> None:
        svc = self._svc()
        if action == view.ACTION_KEEP:
            c = await svc.keep(who, claim_id, self.source)
            await out.reply(note(f"✅ kept: {c.node} GPU {c.gpu} until ", view.until(c.end)))
            return
        gone = await svc.release_one(who, claim_id, self.source)
        await self._serve_now(svc, gone, svc.clock.now())
        await out.reply(view.render_ended(gone, "released"))

    async def _serve_now(self, svc: ClaimService, gone: Sequence[Claim], now: float) -> None:
        """Tell the first in line for released GPUs at once. The release is done and audited, so
        a node that cannot be asked now must not make it read as failed (the next tick serves)."""
        for node in dict.fromkeys(c.node for c in gone):
            try:
                await self._tell(await svc.serve(node, now))
            except GpubotError as exc:
                log.warning(
                    "the queue of %s waits for the next tick: %s", node, exc, extra=DUTY_TURN
                )

    async def free_intruder(self, value: str, who: Person, out: Surface) -> None:
        """*Free it* of an intruder: the claimant's own reset of that process, which, being
        someone else's, waits for an on-call approver; the request says whose claim it is."""
        try:
            svc = self._svc()
            i = await svc.intruder(value, who.id)
            if i is None:
                raise UsageError(
                    "that process is no longer seen on the claimed GPU: nothing to free"
                )
            if who.refused is not None or who.id != i.claim.chat_id:
                raise UsageError("only the person who claimed the GPU may ask to free it")
            now = await svc.store.get(i.claim.id)  # the sweep's copy may have ended since
            if now is None or now.state is not ClaimState.ACTIVE:
                raise UsageError(
                    f"your claim of {i.claim.node} GPU {i.claim.gpu} has ended: nothing to free"
                )
            p = i.process
            if not await holds(svc.status, i.claim.node, p.pid, p.start_ticks, p.gpu_index):
                raise UsageError(f"pid {p.pid} no longer holds {i.claim.node} GPU {i.claim.gpu}")
            line = f"reset {i.claim.node} gpu {i.claim.gpu} pid {p.pid}"
            cmd = commands.parse(line)
            if not isinstance(cmd, commands.Reset) or self.reset is None:
                raise UsageError("resets are not set up here")
        except GpubotError as exc:
            await out.reply(error_message(exc))
            return
        text = f"/gpu {line} (Free it: claimed by {i.claim.user}; {i.what()})"
        await self.reset(cmd, who, out, text=text, context=view.intruder_reason(i))

    # -- the duty ----------------------------------------------------------------------------

    async def tick(self) -> int:
        """Expire claims, end holds, serve the queue, tell people; return the DMs sent."""
        if self.service is None:
            return 0
        try:
            events = await self.service.tick()
        except StoreError as exc:  # the next tick tries again
            log.warning("claims duty skipped: %s", exc, extra=DUTY_TURN)
            return 0
        return await self._tell(events)

    async def _tell(self, events: list[Event] | list[Offered]) -> int:
        sent = 0
        for e in events:
            told = _dm_of(e)
            if told is None:
                continue
            to, msg, subject = told
            try:
                ok = await self.dm(to, msg, subject)
            except Exception:  # a DM is a courtesy: the command and the duty stand
                log.exception("the DM to %s failed", to)
                continue
            sent += ok
            if ok and isinstance(e, Offered) and e.hold and self.service is not None:
                self.service.held(e.wait.id)  # delivered: until then the duty asks again
            if ok and isinstance(e, Ahead | ProcsAhead) and self.service is not None:
                self.service.warned(e.subject)
        return sent


def _dm_of(e: Event | Offered) -> tuple[str, Message, str] | None:
    """Return who an event tells, the message, and that DM's subject (stable: the event's
    rows, so that the same DM is one outbox entry), or None."""
    if isinstance(e, Offered):
        w = e.wait
        held = ",".join(map(str, w.offered or w.gpus))
        subject = f"dm:claims:offer:{w.id}:{w.node}:{held}:{w.hold_until}"
        return w.chat_id, view.render_offer(w, e.uuids, hold=e.hold), subject
    if isinstance(e, Intruding):
        c = e.intruder.claim
        return (
            c.chat_id,
            view.render_intruder(e.intruder, e.key),
            f"dm:claims:intruder:{c.id}:{e.key}",
        )
    if isinstance(e, IdleAsked):
        c = e.claim
        subject = f"dm:claims:idle:{c.id}:{c.idle_since}"
        return c.chat_id, view.render_idle_asked(c, e.idle_s), subject
    if isinstance(e, IdleReleased):
        c = e.claim
        return c.chat_id, view.render_idle_released(c), f"dm:claims:released:{c.id}"
    if isinstance(e, Ended) and e.claim is not None:
        c = e.claim
        return c.chat_id, view.render_expired(c), f"dm:claims:expired:{c.id}"
    if isinstance(e, Ended) and e.wait is not None:
        w = e.wait
        return w.chat_id, view.render_lapsed(w), f"dm:claims:lapsed:{w.id}"
    if isinstance(e, Ahead):
        return e.chat_id, view.render_maint_ahead(e), e.subject
    if isinstance(e, ProcsAhead):
        return e.chat_id, view.render_procs_ahead(e), e.subject
    return None


MAX_SHOWN = 12  # claims listed under a status or on the Home tab


async def with_claims(
    desk: ClaimDesk, msg: Message, nodes: Sequence[str] | None, *, mine: str | None = None
) -> Message:
    """Return ``msg`` with the active claims of ``nodes`` (None: all; ``mine``: this person's)
    under it; a database that fails leaves ``msg`` as it is: the status stands."""
    svc = desk.service
    if svc is None or not svc.enabled:
        return msg
    try:
        found = await svc.store.active()
    except GpubotError as exc:
        log.warning("claims not shown: %s", exc)
        return msg
    shown = [
        c
        for c in found
        if (nodes is None or c.node in nodes) and (mine is None or c.chat_id == mine)
    ]
    if not shown:
        return msg
    rows = [(f"{c.node} GPU {c.gpu} ", *view.claimed_line(c)) for c in shown[:MAX_SHOWN]]
    more = len(shown) - MAX_SHOWN
    title: Text = (bold("Your claims" if mine else "Claims"),)
    text = lines(title, *rows, *((f"… and {more} more (`/gpu claims`)",),) * (more > 0))
    part = Section(text)
    body = (*msg.body[:1], part, *msg.body[1:]) if mine else (*msg.body, part)
    return dataclasses.replace(msg, body=body)
