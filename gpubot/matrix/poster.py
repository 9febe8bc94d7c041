"""Matrix's side of the outbox, and where a flow's messages go in a room.

``MatrixPoster.post`` sends with the outbox's token as the transaction id: a post sent again
after a lost answer (or a crash, the same device and token) is the same event, never a second
one. ``find`` pages the room's timeline for the bot's event whose ``unsigned.transaction_id``
is the token (the homeserver shows it to the device that sent it).

``RoomSurface`` answers where the command was typed: Matrix has no message only one person sees,
so a reply is a notice in the room; an update is an edit (``m.replace``) of the bot's event.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from gpubot.chat.approval_words import may_repeat
from gpubot.chat.message import Message
from gpubot.core.alerting import Delivery, Lookup, MessageRef, Posted
from gpubot.errors import ChatCallFailed, ChatUnanswered
from gpubot.matrix.api import MatrixApi, new_txn
from gpubot.matrix.ids import ref_of, split_ref
from gpubot.matrix.render import edit_of, to_matrix

log = logging.getLogger(__name__)

PAGE = 100  # events a timeline page asks for
MAX_PAGES = 10


def in_thread(content: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    """Return ``content`` in the thread of ``event_id`` (None: in the room itself)."""
    if event_id is None:
        return content
    thread = {"rel_type": "m.thread", "event_id": event_id, "is_falling_back": True}
    return {**content, "m.relates_to": {**thread, "m.in_reply_to": {"event_id": event_id}}}


async def post_once(api: MatrixApi, to: str, msg: Message, *, token: str) -> Posted:
    """Send ``msg`` to ``to`` (a room, or an event's thread) with ``token`` as the transaction
    id; say whether the homeserver has it."""
    room, event = split_ref(to)
    try:
        event_id = await api.send(room, in_thread(to_matrix(msg), event), txn=token)
    except ChatUnanswered as exc:
        return Posted(Delivery.UNCERTAIN, why=exc.error)
    except ChatCallFailed as exc:
        if exc.error.startswith("HTTP 5"):  # the server's side: it may have taken it
            return Posted(Delivery.UNCERTAIN, why=exc.error)
        log.error("sending to %s failed: %s", room, exc.error)
        return Posted(Delivery.REFUSED, why=exc.error)
    return Posted(Delivery.POSTED, ref_of(room, event_id))


async def find_post(api: MatrixApi, to: str, token: str) -> Lookup:
    """Look for the bot's event sent with transaction id ``token`` in ``to``'s room."""
    room, _ = split_ref(to)
    start: str | None = None
    for _ in range(MAX_PAGES):
        try:
            page = await api.messages(room, start, PAGE)
        except ChatCallFailed as exc:
            return Lookup(False, why=f"room messages: {exc.error}")
        for e in page.get("chunk") or []:
            unsigned = e.get("unsigned") if isinstance(e, dict) else None
            if isinstance(unsigned, dict) and unsigned.get("transaction_id") == token:
                return Lookup(True, ref_of(room, str(e["event_id"])))
        start = page.get("end")
        if not start:
            return Lookup(True)
    return Lookup(False, why=f"more than {MAX_PAGES * PAGE} events to search")


class MatrixPoster:
    """The outbox's ``Poster`` on Matrix: neutral messages posted once, and found."""

    def __init__(self, api: MatrixApi) -> None:
        self.api = api
        self.dms: dict[str, str] = {}  # user → the DM room this process made or found

    async def post(
        self, to: str, msg: Message, *, token: str, repeat_of: datetime | None = None
    ) -> Posted:
        shown = msg if repeat_of is None else may_repeat(msg, repeat_of)
        return await post_once(self.api, to, shown, token=token)

    async def find(self, to: str, token: str, since: datetime) -> Lookup:
        return await find_post(self.api, to, token)

    async def direct(self, user: str) -> str | None:
        """Return a DM room with ``user`` (one the bot shares with them alone, else a new one)."""
        if user in self.dms:
            return self.dms[user]
        try:
            for room in await self.api.joined_rooms():
                if await self.api.joined_members(room) == {self.api.access.user_id, user}:
                    self.dms[user] = room
                    return room
            self.dms[user] = await self.api.create_dm(user)
        except ChatCallFailed as exc:
            log.warning("no direct message room with %s: %s", user, exc)
            return None
        return self.dms[user]


class RoomSurface:
    """A flow's messages in one room (``room``: where the command was typed)."""

    def __init__(self, api: MatrixApi, room: str | None) -> None:
        self.api = api
        self.room = room

    async def _send(self, room: str, msg: Message) -> MessageRef | None:
        try:
            return ref_of(room, await self.api.send(room, to_matrix(msg), txn=new_txn()))
        except ChatCallFailed as exc:
            log.error("sending to %s failed: %s", room, exc)
            return None

    async def reply(self, msg: Message) -> None:
        if self.room is None:
            log.warning("no room to answer in: not sent: %s", to_matrix(msg)["body"])
            return
        await self._send(self.room, msg)

    async def post(self, msg: Message, *, channel: str | None = None) -> MessageRef | None:
        room = channel or self.room
        return None if room is None else await self._send(room, msg)

    async def update(self, handle: MessageRef | None, msg: Message) -> MessageRef | None:
        """Edit the bot's event ``handle`` (``m.replace``), or send anew if that fails."""
        room, event = split_ref(handle) if handle is not None else (self.room, None)
        if room is None:
            return None
        if event is None:
            return await self._send(room, msg)
        try:
            await self.api.send(room, edit_of(event, msg), txn=new_txn())
        except ChatCallFailed as exc:
            log.warning("editing %s failed (%s): sending anew", handle, exc)
            return await self._send(room, msg)
        return handle
