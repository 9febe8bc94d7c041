"""Claims and the queue: the commands, the expiry and who is told a GPU is free.

A claim kills nothing. The duty expires claims, ends holds that ran out and serves the queue: a
GPU is free for it once released, or after two looks in a row with no job and little memory. The
first in line gets a hold (a conditional write: one offer across replicas). Without ``[claims]
enabled``, ``wait`` still tells the person, and nothing is held. A hold recorded by any process
(the CLI, which cannot message, a replica, a run before a restart) is returned by the duty every
turn until the front end says its DM was delivered (once, through the outbox).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpubot.config import Settings
from gpubot.core import durations
from gpubot.core import maint as mc
from gpubot.core.claims import commands as cc
from gpubot.core.claims.ports import ClaimStore
from gpubot.core.claims.rules import (
    Claim,
    ClaimOutcome,
    ClaimRequest,
    Intruder,
    Limit,
    Wait,
    WaitState,
    free_gpus,
    intruders,
    pick,
)
from gpubot.core.clock import SYSTEM_CLOCK, steps_of
from gpubot.core.findings import Finding
from gpubot.core.maint import Ahead, ProcsAhead, Window, WindowStore, clash, clock, refusal
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.policy import Person
from gpubot.core.ports import Clock
from gpubot.errors import DUTY_TURN, GpubotError, StoreError, UsageError
from gpubot.services.claim_checks import intruder_now, refuse_others, refuse_scheduled, uuids_of
from gpubot.services.claim_idle import IdleAsked, IdleReleased, idle_claims
from gpubot.services.maint import holders_ahead
from gpubot.services.status import StatusService

log = logging.getLogger(__name__)

FREE_LOOKS = 2  # looks in a row a GPU must be free before the queue is told (unless released)
OFF = (
    "claims are not enabled here ([claims] enabled = false); "
    "`/gpu wait NODE` still tells you when a GPU is free"
)


@dataclass(frozen=True)
class Offered:
    """The queue holds ``wait.offered`` for ``wait``'s person (or, without claims, tells them)."""

    wait: Wait
    uuids: tuple[str, ...]
    hold: bool  # False: claims are off; they were only told


@dataclass(frozen=True)
class Ended:
    """A claim ended by the duty (its time ran out), or a hold that lapsed."""

    claim: Claim | None = None
    wait: Wait | None = None


@dataclass(frozen=True)
class Intruding:
    """Someone else's process on a claimed GPU, past ``intruder_grace_s``: tell the claimant."""

    intruder: Intruder
    key: str  # the finding's key text (the Free it button's value)


Event = Offered | Ended | Intruding | IdleAsked | IdleReleased | Ahead | ProcsAhead


class ClaimService:
    """The claim and queue commands of every front end, and the claims' duty."""

    def __init__(
        self,
        settings: Settings,
        store: ClaimStore,
        status: StatusService,
        *,
        clock: Clock = SYSTEM_CLOCK,
        observe: Callable[[list[tuple[str, int, str]]], None] | None = None,
        maint: WindowStore | None = None,
    ) -> None:
        """``maint``: the maintenance windows, which refuse (or cut) claims that run into them
        and whose claims' holders the duty tells ahead."""
        self.settings = settings
        self.maint = maint
        self._warned: set[str] = set()  # the maintenance DMs known delivered (their subjects)
        self.config = settings.claims
        self.slurm = settings.slurm
        self.store = store
        self.status = status
        self.clock = clock
        self._free: dict[tuple[str, int], int] = {}  # looks in a row each GPU was free
        self._intruders: dict[str, tuple[Intruder, float]] = {}  # key → it, first seen
        self._told: set[str] = set()  # intruders whose claimant was told
        self._delivered: set[int] = set()  # the holds whose DM is known delivered (``held``)
        self.observe = observe  # the metrics' gauge of claimed GPUs

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def _need(self, who: Person) -> str:
        if not self.enabled:
            raise UsageError(OFF)
        if who.linux_user is None:
            raise UsageError(
                "you have no Linux user on the boxes ([users] in the settings), so you cannot claim"
            )
        return who.linux_user

    # -- claims ------------------------------------------------------------------------------

    async def claim(self, who: Person, cmd: cc.ClaimGpus, source: str) -> ClaimOutcome:
        user = self._need(who)
        node = self.status.node(cmd.node)
        most_h, _ = self.config.limits_for(node.groups)
        if cmd.duration_s > most_h * 3600:
            most = durations.format(most_h * 3600)
            raise UsageError(f"a claim on {node.name} lasts at most {most} ([claims] max_hours)")
        snap = await self.status.snapshot(node)
        refuse_scheduled(snap, node, cmd, self.slurm)
        claimed = [c.gpu for c in await self.store.active(node.name)]
        if cmd.gpus:
            gpus = cmd.gpus
            refuse_others(snap, [g for g in gpus if g not in claimed], user, node.name)
        else:
            free = free_gpus(snap, claimed, self.config.free_below_mib)
            gpus = pick(free, cmd.count, await self.store.used_last(who.id, node.name))
            if not gpus:
                raise UsageError(
                    f"{node.name} has {len(free)} free GPU(s), fewer than {cmd.count}: "
                    f"`/gpu wait {node.name} any {cmd.count}` queues you"
                )
        return await self._claim(who, node, uuids_of(snap, gpus), cmd.duration_s, cmd.note, source)

    async def take(self, who: Person, wait_id: int, source: str) -> ClaimOutcome:
        """Claim what the queue holds for ``who`` (the DM's button)."""
        self._need(who)
        w = await self.store.get_wait(wait_id)
        if w is None or w.chat_id != who.id:
            raise UsageError(f"no place {wait_id} of yours in the queue")
        if w.state is not WaitState.OFFERED:
            raise UsageError(f"place {wait_id} holds nothing now ({w.state.value})")
        node = self.status.node(w.node)
        snap = await self.status.snapshot(node)
        most_h, _ = self.config.limits_for(node.groups)
        duration = min(w.duration_s or most_h * 3600, most_h * 3600)
        note = f"from the queue (place {w.id})"
        return await self._claim(who, node, uuids_of(snap, w.offered), duration, note, source, w.id)

    async def _claim(
        self,
        who: Person,
        node: NodeConfig,
        gpus: tuple[tuple[int, str], ...],
        duration_s: float,
        note: str,
        source: str,
        wait_id: int | None = None,
    ) -> ClaimOutcome:
        now = self.clock.now()
        w = clash(node.name, now, now + duration_s, await self.windows(now, node.name))
        if w is not None and wait_id is not None and w.start - now >= 60:
            duration_s = w.start - now  # the queue's hold: cut to end as the window starts
            note = f"{note}; cut to end at {clock(w.start, now)} UTC: {w.shown(now)}"
        elif w is not None:
            raise UsageError(refusal(w, now, now + duration_s, now))
        return await self.store.claim(
            ClaimRequest(
                node=node.name,
                gpus=gpus,
                user=self._need(who),
                chat_id=who.id,
                start=now,
                end=now + duration_s,
                note=note,
                source=source,
                limits=self._limits(node.name, node.groups),
                wait_id=wait_id,
            )
        )

    async def windows(self, now: float, node: str | None = None) -> list[Window]:
        """Return the maintenance windows not over at ``now`` (none without ``maint``)."""
        return [] if self.maint is None else await self.maint.live(now, node)

    def _limits(self, node: str, groups: tuple[str, ...]) -> tuple[Limit, ...]:
        out = [Limit(self.config.max_gpus_per_user)]
        for g in self.config.groups:
            if g.group in groups and g.max_gpus_per_user is not None:
                members = self.settings.groups().get(g.group, (node,))
                out.append(Limit(g.max_gpus_per_user, members, g.group))
        return tuple(out)

    async def extend(self, who: Person, cmd: cc.Extend, source: str) -> list[tuple[Claim, bool]]:
        """Extend ``who``'s claims (each up to its node's ``max_hours`` from its start)."""
        self._need(who)
        if cmd.node is not None:
            self.status.node(cmd.node)
        await self._refuse_extend_into(who, cmd)
        now, where = self.clock.now(), (cmd.node, cmd.gpus)
        done = await self.store.extend(
            who.id, where, cmd.by_s, most_s=self._most_s, now=now, source=source
        )
        if not done:
            raise UsageError("you have no claim there to extend (see `/gpu claims mine`)")
        return done

    async def _refuse_extend_into(self, who: Person, cmd: cc.Extend) -> None:
        """Refuse an extension that would make a claim run into a maintenance window."""
        now = self.clock.now()
        windows = await self.windows(now, cmd.node)
        if not windows:
            return
        for c in await self.store.active(cmd.node):
            if c.chat_id != who.id or (cmd.gpus and c.gpu not in cmd.gpus):
                continue
            w = clash(c.node, now, c.end + cmd.by_s, windows)
            if w is not None:
                said = refusal(w, now, c.end + cmd.by_s, now).removeprefix("not claimed: ")
                raise UsageError(f"not extended: {said}")

    def _most_s(self, node: str) -> float:
        cfg = self.settings.node(node)
        return self.config.limits_for(cfg.groups if cfg else ())[0] * 3600

    async def release(self, who: Person, cmd: cc.Release, source: str) -> list[Claim]:
        """Release ``who``'s claims; the queue of their nodes is served at once."""
        self._need(who)
        if cmd.node is not None:
            self.status.node(cmd.node)
        now = self.clock.now()
        gone = await self.store.release(who.id, (cmd.node, cmd.gpus), now=now, source=source)
        if not gone:
            raise UsageError("you have no claim there to release (see `/gpu claims mine`)")
        self._freed(gone)
        return gone

    def _freed(self, gone: Iterable[Claim]) -> None:
        """Released: free for the queue at once, if nothing runs on it."""
        for c in gone:
            self._free[(c.node, c.gpu)] = FREE_LOOKS - 1

    async def keep(self, who: Person, claim_id: int, source: str) -> Claim:
        kept = await self.store.keep(claim_id, who.id, self.clock.now(), source)
        if kept is None:
            raise UsageError(f"claim {claim_id} is not an active claim of yours")
        return kept

    async def release_one(self, who: Person, claim_id: int, source: str) -> list[Claim]:
        """Release one claim of ``who``'s (the Release button)."""
        now = self.clock.now()
        gone = await self.store.release(who.id, (None, ()), now=now, source=source, ids={claim_id})
        if not gone:
            raise UsageError(f"claim {claim_id} is not an active claim of yours")
        self._freed(gone)
        return gone

    async def claims(self, who: Person, cmd: cc.ListClaims) -> list[Claim]:
        if cmd.scope not in ("all", "mine"):
            self.status.node(cmd.scope)
            return await self.store.active(cmd.scope)
        found = await self.store.active()
        return [c for c in found if cmd.scope == "all" or c.chat_id == who.id]

    # -- the queue ---------------------------------------------------------------------------

    async def wait(self, who: Person, cmd: cc.WaitFor, source: str) -> tuple[Wait, int]:
        node = self.status.node(cmd.node)
        ahead = len(await self.store.waits(node.name))
        w = Wait(
            0,
            node.name,
            cmd.gpus,
            cmd.count,
            cmd.duration_s,
            who.linux_user or "",
            who.id,
            self.clock.now(),
        )
        return await self.store.add_wait(w, source), ahead

    async def queue(self, node: str | None) -> list[Wait]:
        if node is not None:
            self.status.node(node)
        return await self.store.waits(node)

    async def leave(self, who: Person, wait_id: int | None, source: str) -> list[Wait]:
        left = await self.store.leave(who.id, wait_id, self.clock.now(), source)
        if not left:
            raise UsageError("you are not in the queue there (see `/gpu queue`)")
        return left

    # -- intruders ----------------------------------------------------------------------------

    async def intruder_findings(self, snaps: Sequence[NodeSnapshot], now: float) -> list[Finding]:
        """Return the sweep findings of unclaimed use of claimed GPUs; remember them, so the
        duty tells each claimant once, after the grace."""
        if not self.enabled:
            return []
        try:
            active = await self.store.active()
        except StoreError as exc:  # the sweep stands; intruders wait for the next one
            log.warning("claims not read, intruders not looked for: %s", exc, extra=DUTY_TURN)
            return []
        del now  # the sweep's start; the grace runs on this service's clock, as the duty does
        seen = self.clock.now()
        found: dict[str, tuple[Intruder, float]] = {}
        for snap in snaps:
            for i in intruders(snap, active):
                key = i.finding().key.text()
                found[key] = (i, self._intruders.get(key, (i, seen))[1])
        self._intruders = found
        self._told &= set(found)
        return [i.finding() for i, _ in found.values()]

    async def intruder(self, key: str, claimant: str) -> Intruder | None:
        """The intruder of finding ``key``: remembered by this process's sweeps, else looked
        for now for its GPU's ``claimant`` (the DM may be another process's, or older)."""
        got = self._intruders.get(key)
        found = got[0] if got is not None else None
        return found or await intruder_now(self.status, self.store, key, claimant)

    async def _due_intruders(self, now: float) -> list[Intruding]:
        out = []
        for key, (i, since) in self._intruders.items():
            if key not in self._told and now - since >= self.config.intruder_grace_s:
                told = await self.store.tell_intruder(i.claim.id, key, now)  # once, any replica
                self._told.add(key)  # after the write: a failed one is tried again next tick
                if told:
                    out.append(Intruding(i, key))
        return out

    # -- the duty ----------------------------------------------------------------------------

    async def tick(self) -> list[Event]:
        """Expire claims, end holds that ran out, serve the queue; return what to tell. A
        passing forward step of the wall clock must not end a claim with an hour left."""
        now = self.clock.now()
        due = steps_of(self.clock).expiry_now()
        events: list[Event] = []
        if self.enabled:
            events += [Ended(claim=c) for c in await self.store.expire(due)]
            events += await self._due_intruders(now)
            idle = await idle_claims(self.config, self.store, self.status, now)
            self._freed(e.claim for e in idle if isinstance(e, IdleReleased))
            events += idle
            if self.observe is not None:
                self.observe([(c.node, c.gpu, c.user) for c in await self.store.active()])
        events += [Ended(wait=w) for w in await self.store.lapse(due)]
        events += await self._ahead(now)
        waiting = await self.store.waits()
        self._delivered &= {w.id for w in waiting}  # the others ended: forgotten
        for node in dict.fromkeys(w.node for w in waiting):
            try:
                events += await self.serve(node, now)
            except GpubotError as exc:  # one node fails alone
                log.warning("the queue of %s was not served: %s", node, exc, extra=DUTY_TURN)
        return events

    async def _ahead(self, now: float) -> list[Ahead | ProcsAhead]:
        """Return whom to tell of a window from ``[maint] notify_before`` ahead, each once: the
        holders of claims into it, and the people with processes on its node."""
        windows = await self.windows(now)
        if not windows:
            return []
        before = self.settings.maint.notify_before_s
        claims = await self.store.active() if self.enabled else []
        active = [(c.id, c.node, c.chat_id, c.gpu, c.start, c.end) for c in claims]
        found: list[Ahead | ProcsAhead] = [*mc.due_notices(windows, active, now, before)]
        ids = self.settings.policy.chat_ids()
        found += await holders_ahead(windows, self.status, ids, now, before)
        return [a for a in found if a.subject not in self._warned]

    def warned(self, subject: str) -> None:
        """Record that a maintenance DM was delivered: the duty stops returning it."""
        self._warned.add(subject)

    async def serve(self, node: str, now: float) -> list[Offered]:
        """Offer free GPUs of ``node`` to its first waiters who can be served; none while a
        maintenance window is open there."""
        waits = await self.store.waits(node)
        if not waits or any(w.open_at(now) for w in await self.windows(now, node)):
            return []
        snap = await self.status.snapshot(self.status.node(node))
        claimed = [c.gpu for c in await self.store.active(node)] if self.enabled else []
        held = {g for w in waits if w.state is WaitState.OFFERED for g in w.offered}
        free_now = set(free_gpus(snap, claimed, self.config.free_below_mib))
        for g in snap.gpus:
            key = (node, g.index)
            self._free[key] = self._free.get(key, 0) + 1 if g.index in free_now else 0
        ready = [g for g in sorted(free_now - held) if self._free[(node, g)] >= FREE_LOOKS]
        out = self._live_holds(snap, waits, now)
        hold_s = self.config.hold_minutes * 60 if self.enabled else 0.0
        for w in (w for w in waits if w.state is WaitState.WAITING):
            gpus = _serve(w, ready)
            if not gpus:
                continue
            got = await self.store.offer(w.id, gpus, now + max(hold_s, 1.0), now)
            if got is None:  # another replica offered them first, or the person left
                continue
            ready = [g for g in ready if g not in gpus]
            out.append(Offered(got, tuple(u for _, u in uuids_of(snap, gpus)), self.enabled))
            if not self.enabled:
                await self.store.told(got.id, now)
        return out

    def _live_holds(self, snap: NodeSnapshot, waits: Sequence[Wait], now: float) -> list[Offered]:
        """Return the node's live holds whose DM is not known delivered, to tell (again)."""
        out: list[Offered] = []
        for w in waits:
            live = w.state is WaitState.OFFERED and (w.hold_until or 0.0) > now
            if not live or w.id in self._delivered:
                continue
            try:
                uuids = tuple(u for _, u in uuids_of(snap, w.offered))
            except UsageError:  # the GPU is not seen now: told once the node shows it
                continue
            out.append(Offered(w, uuids, hold=True))
        return out

    def held(self, wait_id: int) -> None:
        """Record that a hold's DM was delivered: only then does the duty stop returning it."""
        self._delivered.add(wait_id)


def _serve(w: Wait, ready: Sequence[int]) -> tuple[int, ...]:
    if w.gpus:
        return w.gpus if set(w.gpus) <= set(ready) else ()
    return tuple(ready[: w.count]) if len(ready) >= w.count else ()


__all__ = ["IdleAsked", "IdleReleased"]  # re-exported for the front ends
