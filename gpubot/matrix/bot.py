"""The Matrix bot at run time: a ``/sync`` long poll whose events become ``Flows`` calls.

- The first sync's backlog is skipped: a restarted bot never runs the commands it saw before.
- ``!gpu …`` in an allowed room (``[matrix] rooms``) or a DM with the bot runs as the console's
  and Slack's commands do; the sender is who asks.
- A ✅ or ❌ reaction (``m.annotation``) on the bot's own approval request decides it, as
  ``!gpu approve N`` / ``!gpu deny N`` do; the reaction's sender (attested by the homeserver) is
  the approver, and the approval service's rules (approvers, no self-approval, exactly once)
  are Slack's, since it is the same service.
- A user of another homeserver is refused in one line unless ``[matrix] servers`` allows it.
- An encrypted room is refused in one line, in the room and in the log: never a silent drop.
Each command runs in a tracked task, so the long poll goes on while a reset runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from gpubot.chat.background import Background
from gpubot.chat.errors import error_message
from gpubot.chat.flows import Flows, help_message
from gpubot.chat.message import note
from gpubot.core import commands
from gpubot.core.policy import Person, resolve
from gpubot.errors import ChatCallFailed, GpubotError, UsageError
from gpubot.matrix.api import MatrixApi, pause
from gpubot.matrix.ids import ref_of, server_of
from gpubot.matrix.poster import RoomSurface
from gpubot.matrix.render import APPROVAL_KEY, APPROVE, DENY, PREFIX
from gpubot.matrix.typed import Typed, typed_action

log = logging.getLogger(__name__)

ENCRYPTION = "m.room.encryption"  # the state event that makes a room encrypted
MAX_SEEN = 10_000
WAIT_S = 25.0  # a long poll's wait
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between failed syncs: a homeserver down is waited out
ENCRYPTED = (
    "🔒 This room is end-to-end encrypted: gpubot cannot read it. "
    "Use gpubot in an unencrypted room."
)


@dataclass(frozen=True)
class MatrixParts:
    """What the Matrix front end is given: its flows, the API adapter, where it answers."""

    flows: Flows
    api: MatrixApi
    rooms: frozenset[str]  # where commands are read (besides DMs with the bot)
    servers: frozenset[str] = frozenset()  # other homeservers whose users may use gpubot
    typed: Typed | None = None  # what runs an alert's or the ladder's typed buttons


def command_line(body: str) -> str | None:
    """Return ``!gpu …`` as the ``/gpu …`` line the flows parse (None: not a command)."""
    words = body.strip().split(maxsplit=1)
    if not words or words[0].lower() != PREFIX:
        return None
    return "/gpu " + (words[1] if len(words) > 1 else "")


def foreign(sender: str, me: str, servers: frozenset[str]) -> str | None:
    """Why ``sender`` may not use gpubot as a user of another homeserver (None: they may)."""
    server = server_of(sender)
    if server == server_of(me) or server in servers:
        return None
    return f"accounts of another homeserver ({server}) cannot use gpubot"


class MatrixBot(Background):
    """The Matrix front end over the shared flows."""

    def __init__(self, parts: MatrixParts) -> None:
        self.parts = parts
        self.flows = parts.flows
        self.api = parts.api
        self.me = parts.api.access.user_id
        super().__init__()
        self.refused_rooms: set[str] = set()  # encrypted rooms told already
        self.seen: set[str] = set()  # event ids handled (a sync may repeat one after a retry)
        self.started = time.monotonic()  # reset when ``run`` starts
        self.ready = asyncio.Event()  # set once the first sync (the history) is behind

    # -- the long poll ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Sync until ``stop``; the first sync's events are history, never run, and so is any
        event older than this run: Synapse answers an initial sync repeated within minutes on
        the same device from its cache, whose token is older than the restart."""
        self.started = time.monotonic()
        since: str | None = None
        failures = 0
        while not stop.is_set():
            polling = asyncio.ensure_future(self.api.sync(since, WAIT_S))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not polling.done():
                polling.cancel()
                await asyncio.gather(polling, return_exceptions=True)
                break
            stopping.cancel()
            try:
                answer = polling.result()
            except ChatCallFailed as exc:
                wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                log.warning("Matrix sync failed (%s): again in %.0f s", exc, wait)
                await pause(wait)
                continue
            failures = 0
            await self.handle(answer, history=since is None)
            self.ready.set()
            if len(self.seen) > MAX_SEEN:
                self.seen.clear()  # ids repeat only across one retried sync
            since = str(answer.get("next_batch") or since or "") or None

    async def handle(self, answer: dict[str, Any], *, history: bool) -> None:
        """Act on one sync's rooms: join the invitations, run the new events."""
        rooms = answer.get("rooms") or {}
        for room, data in (rooms.get("invite") or {}).items():
            await self.on_invite(str(room), data)
        if history:
            return
        for room, data in (rooms.get("join") or {}).items():
            state = (data.get("state") or {}).get("events") or []
            if any(isinstance(e, dict) and e.get("type") == ENCRYPTION for e in state):
                await self.refuse_encrypted(str(room))  # joined an encrypted room
            for event in (data.get("timeline") or {}).get("events") or []:
                if isinstance(event, dict) and not self.before_start(event):
                    await self.on_event(str(room), event)

    def before_start(self, event: dict[str, Any]) -> bool:
        """Whether ``event`` was sent before this run started, by its age as the homeserver
        counts it (a duration: no clock of ours is compared with the server's)."""
        age = (event.get("unsigned") or {}).get("age")
        if not isinstance(age, int) or isinstance(age, bool):
            return False
        return age > (time.monotonic() - self.started) * 1000.0

    async def on_invite(self, room: str, data: Any) -> None:
        """Join an allowed room, or a DM (the invitation says ``is_direct``)."""
        events = ((data or {}).get("invite_state") or {}).get("events") or []
        direct = any(
            e.get("type") == "m.room.member"
            and e.get("state_key") == self.me
            and (e.get("content") or {}).get("is_direct") is True
            for e in events
            if isinstance(e, dict)
        )
        if room not in self.parts.rooms and not direct:
            log.info("invited to %s, which is no [matrix] room nor a DM: not joined", room)
            return
        try:
            await self.api.join(room)
        except ChatCallFailed as exc:
            log.warning("cannot join %s: %s", room, exc)

    async def on_event(self, room: str, e: dict[str, Any]) -> None:
        sender, kind, event_id = str(e.get("sender")), e.get("type"), str(e.get("event_id"))
        if sender == self.me or event_id in self.seen:
            return
        self.seen.add(event_id)
        if kind in ("m.room.encrypted", ENCRYPTION):
            await self.refuse_encrypted(room)
            return
        content = e.get("content")
        if not isinstance(content, dict) or not await self.allowed(room, sender):
            return
        if kind == "m.room.message" and isinstance(content.get("body"), str):
            line = command_line(content["body"])
            if line is not None:
                self.spawn(self.command(room, sender, line), f"command in {room}")
        elif kind == "m.reaction":
            relates = content.get("m.relates_to") or {}
            if relates.get("rel_type") == "m.annotation":
                key = str(relates.get("key", "")).replace("\ufe0f", "")
                target = str(relates.get("event_id", ""))
                if key in (APPROVE, DENY) and target:
                    self.spawn(self.react(room, sender, target, key == APPROVE), "reaction")

    async def allowed(self, room: str, sender: str) -> bool:
        """Whether commands are read in ``room``: a configured room, or a DM with the bot."""
        if room in self.parts.rooms:
            return True
        try:
            return await self.api.joined_members(room) == {self.me, sender}
        except ChatCallFailed as exc:
            log.warning("cannot tell whether %s is a DM: %s", room, exc)
            return False

    async def refuse_encrypted(self, room: str) -> None:
        """Say once per room (and in the log) that an encrypted room is not read."""
        if room in self.refused_rooms:
            return
        self.refused_rooms.add(room)
        log.warning("room %s is encrypted: gpubot does not read it (refused in the room)", room)
        await RoomSurface(self.api, room).reply(note(ENCRYPTED))

    # -- people, commands, reactions ----------------------------------------------------------

    def person(self, sender: str) -> Person:
        """Who ``sender`` is: a user of another homeserver is refused unless it is allowed."""
        refused = foreign(sender, self.me, self.parts.servers)
        found = resolve(self.flows.svc.policy, sender, None, None)
        return Person(sender, sender, found.linux_user, refused or found.refused)

    async def command(self, room: str, sender: str, line: str) -> None:
        out = RoomSurface(self.api, room)
        who = self.person(sender)
        if await typed_action(self.parts.typed, line.split(maxsplit=4)[1:], who, out):
            return
        try:
            cmd = commands.parse(line, decisions=True)
            self.flows.check(cmd)
        except UsageError as exc:
            verb = line.split()[1:2]
            hint = commands.help_text(verb[0]) if verb and verb[0].lower() in commands.USAGE else ""
            await out.reply(note(f"⚠ {exc}\n{hint}".strip()))
            return
        if isinstance(cmd, commands.Help):
            text = commands.help_text(cmd.topic, decisions=True).replace("/gpu", PREFIX)
            await out.reply(help_message(text))
            return
        await self.flows.run(cmd, who, out, text=line)

    async def react(self, room: str, sender: str, target: str, approve: bool) -> None:
        """Decide the approval request ``target`` (the bot's own event) as ``sender``."""
        out = RoomSurface(self.api, room)
        try:
            event = await self.api.event(room, target)
        except ChatCallFailed as exc:
            log.warning("cannot read the reacted event %s: %s", target, exc)
            return
        approval = (event.get("content") or {}).get(APPROVAL_KEY)
        if event.get("sender") != self.me or not isinstance(approval, int):
            return  # a reaction on something that is no request of ours
        who = self.person(sender)
        if who.refused is not None:
            await out.reply(error_message(GpubotError(who.refused)))
            return
        await self.flows.decide(approval, approve, who, out, handle=ref_of(room, target))
