"""Sweep alerts on Matrix: posted once in the alerts' room, edited as they change, and the idle
holders' DMs.

An alert is posted through the one outbox (``services.outbox``) with its token as the
transaction id (``matrix.poster``): a post resent after a lost answer or a crash is the same
event. A change or a resolution edits it (``m.replace``); a reminder and a digest's details go in
its thread (``m.thread``). An idle-holder alert is also sent once as a DM to each owner the
settings map to a Matrix user (the outbox's subject ``chat.idle.idle_subject``, its token the
transaction id again); a DM that cannot be sent is logged and changes nothing else. Matrix has
no buttons: the messages say what to type (``!gpu free KEY``, ``!gpu snooze 1h KEY``,
``!gpu reset NODE gpu N``), and those run the flows Slack's buttons run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from gpubot.chat.alert_digest import is_digest, render_alert, render_digest_details
from gpubot.chat.alerts import render_reminder
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.idle import tell_idle_owners
from gpubot.chat.message import Message
from gpubot.core.alerting import AlertGroup, Delivery, Lookup, MessageRef, Posted
from gpubot.errors import ChatCallFailed
from gpubot.matrix.api import new_txn
from gpubot.matrix.ids import split_ref
from gpubot.matrix.poster import MatrixPoster, post_once
from gpubot.matrix.render import edit_of
from gpubot.services.outbox import Outbox

log = logging.getLogger(__name__)


class MatrixAlerts:
    """Posts, edits and reminds alert messages in one room (the ``Notifier`` port). ``people``:
    Linux user → Matrix user ids, whose idle holders are told by DM once each (``outbox``)."""

    def __init__(
        self,
        poster: MatrixPoster,
        room: str,
        *,
        people: Mapping[str, Sequence[str]],
        outbox: Outbox[Message],
        route: DmRoute | None = None,
    ) -> None:
        self.poster = poster
        self.api = poster.api
        self.room = room
        self.people = people
        self.route = route  # how another front end's people get their DMs (None: they do not)
        self.outbox = outbox
        self._unsure: dict[str, AlertGroup] = {}  # token → a digest whose post is unconfirmed

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        """Post a new alert with ``token`` as its transaction id; once the homeserver has it,
        post a digest's details in its thread and DM the idle holders' owners."""
        posted = await self.poster.post(self.room, render_alert(group), token=token)
        if posted.delivery is Delivery.UNCERTAIN and is_digest(group):
            self._unsure[token] = group  # its details follow if the timeline has it
        if posted.delivery is Delivery.POSTED:  # once per finding: the DM rides on its alert
            try:
                if posted.ref is not None:
                    await self.details(posted.ref, group)
                await self.direct(group, posted.ref)
            except Exception:  # what follows an alert never fails a sweep
                log.exception("details or direct messages of the alert on %s failed", group.node)
        return posted

    async def find(self, token: str, since: datetime) -> Lookup:
        """Look for the alert sent with transaction id ``token``; a digest of this process
        found there gets its details in its thread."""
        lookup = await self.poster.find(self.room, token, since)
        group = self._unsure.pop(token, None) if lookup.checked or lookup.ref else None
        if group is not None and lookup.ref is not None:
            try:
                await self.details(lookup.ref, group)
            except Exception:  # never fails the search
                log.exception("details of the digest %s failed", group.node)
        return lookup

    async def _thread(self, where: MessageRef, msg: Message) -> bool:
        """Post ``msg`` in the thread of ``where``; False (logged) if it did not get there. A
        reply whose answer is lost is not resent."""
        posted = await post_once(self.api, where, msg, token=new_txn())
        return posted.delivery is Delivery.POSTED

    async def details(self, where: MessageRef, group: AlertGroup) -> int:
        """Post a digest's details in its thread (nothing for a node's own alert); return how
        many replies were posted."""
        if not is_digest(group):
            return 0
        return sum([await self._thread(where, m) for m in render_digest_details(group)])

    async def direct(self, group: AlertGroup, where: MessageRef | None) -> int:
        """DM each owner of the group's open idle holders (``chat.idle.tell_idle_owners``);
        return how many DMs were sent or handed over."""
        return await tell_idle_owners(group, where, self.people, self._dm, self.route)

    async def _dm(self, user: str, msg: Message, subject: str) -> bool:
        """Post an idle DM to a Matrix user (due once: it rides on its alert, which the outbox
        posts once; delivered once)."""
        room = await self.poster.direct(user)
        if room is None:
            return False
        return await self.outbox.send(subject, room, msg) is not None

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        """Edit an alert message to the group's current state (``m.replace``)."""
        room, event = split_ref(where)
        if event is None:
            log.error("alert reference %s names no event: not edited", where)
            return
        try:
            await self.api.send(room, edit_of(event, render_alert(group)), txn=new_txn())
        except ChatCallFailed as exc:
            log.error("editing the alert %s failed: %s", where, exc)

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        await self._thread(where, render_reminder(group))
