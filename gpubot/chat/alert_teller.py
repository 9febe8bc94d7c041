"""Sweep alerts in one channel or room, for every front end (the ``Notifier`` port).

An alert is posted once through the front end's ``Poster`` (the one outbox calls ``post`` and
``find``). A kind found on several nodes is one digest: a short message, and each finding's
details as replies in its thread, posted only once the digest is known to be there (answered, or
found again after a lost answer). An idle-holder alert is also told as a DM to each owner
(``chat.idle.tell_idle_owners``); a DM that cannot be sent is logged and changes nothing else.
What differs between front ends is how a reply goes in a thread, how an alert is edited, and how
often a channel may be written to (``AlertTeller``'s three hooks).
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime

from gpubot.chat.alert_digest import is_digest, render_alert, render_digest_details
from gpubot.chat.alerts import render_reminder
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.idle import tell_idle_owners
from gpubot.chat.message import Message
from gpubot.core.alerting import AlertGroup, Delivery, Lookup, MessageRef, Posted
from gpubot.core.ports import Poster
from gpubot.services.outbox import Outbox

log = logging.getLogger(__name__)


class AlertTeller(ABC):
    """Posts, updates and reminds alert messages in ``place``. ``people``: Linux user → chat
    user ids, whose idle holders are told by DM once each (``outbox``; another front end's
    people through ``route``, handed over)."""

    def __init__(
        self,
        poster: Poster[Message],
        place: str,
        *,
        people: Mapping[str, Sequence[str]],
        outbox: Outbox[Message],
        route: DmRoute | None = None,
    ) -> None:
        self.poster, self.place, self.people = poster, place, people
        self.outbox, self.route = outbox, route
        self._unsure: dict[str, AlertGroup] = {}  # token → a digest whose post is unconfirmed

    # -- what each front end does its own way -------------------------------------------------

    def paced(self, place: str) -> AbstractAsyncContextManager[None]:
        """Hold a write to ``place`` until the front end's rate allows it (default: at once)."""
        return contextlib.nullcontext()

    @abstractmethod
    async def reply(self, where: MessageRef, msg: Message, *, broadcast: bool = False) -> bool:
        """Post ``msg`` in the thread of ``where`` (``broadcast``: shown in the channel too,
        where the front end can); False (logged) if it did not get there. A reply whose answer
        is lost is not resent."""

    @abstractmethod
    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        """Show the group's current state in the alert message ``where``."""

    # -- the same everywhere ------------------------------------------------------------------

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        """Post a new alert carrying ``token``; once the front end took it, post a digest's
        details in its thread and DM the idle holders' owners."""
        async with self.paced(self.place):
            posted = await self.poster.post(self.place, render_alert(group), token=token)
        if posted.delivery is Delivery.UNCERTAIN and is_digest(group):
            self._unsure[token] = group  # its details follow if it is found there
        if posted.delivery is Delivery.POSTED:  # once per finding: the DM rides on its alert
            try:
                if posted.ref is not None:
                    await self.details(posted.ref, group)
                await self.direct(group, posted.ref)
            except Exception:  # what follows an alert never fails a sweep
                log.exception("details or direct messages of the alert on %s failed", group.node)
        return posted

    async def find(self, token: str, since: datetime) -> Lookup:
        """Look for the alert carrying ``token``; a digest of this process found there gets its
        details in its thread."""
        lookup = await self.poster.find(self.place, token, since)
        group = self._unsure.pop(token, None) if lookup.checked or lookup.ref else None
        if group is not None and lookup.ref is not None:
            try:
                await self.details(lookup.ref, group)
            except Exception:  # never fails the search
                log.exception("details of the digest %s failed", group.node)
        return lookup

    async def details(self, where: MessageRef, group: AlertGroup) -> int:
        """Post a digest's details in its thread (nothing for a node's own alert); return how
        many replies were posted."""
        if not is_digest(group):
            return 0
        return sum([await self.reply(where, m) for m in render_digest_details(group)])

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        await self.reply(where, render_reminder(group), broadcast=True)

    async def direct(self, group: AlertGroup, where: MessageRef | None) -> int:
        """DM each owner of the group's open idle holders (``chat.idle.tell_idle_owners``);
        return how many DMs were sent or handed over."""
        return await tell_idle_owners(group, where, self.people, self._dm, self.route)

    async def _dm(self, user: str, msg: Message, subject: str) -> bool:
        """Post an idle DM to a user of this front end, paced (due once: it rides on its alert,
        which the outbox posts once; delivered once)."""
        place = await self.poster.direct(user)
        if place is None:
            return False
        async with self.paced(place):
            return await self.outbox.send(subject, place, msg) is not None
