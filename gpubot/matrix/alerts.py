"""Sweep alerts on Matrix: how a reply goes in a thread and an alert is edited; what every front
end does alike is ``chat.alert_teller``'s.

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

from gpubot.chat.alert_digest import render_alert
from gpubot.chat.alert_teller import AlertTeller
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.message import Message
from gpubot.core.alerting import AlertGroup, Delivery, MessageRef
from gpubot.errors import ChatCallFailed
from gpubot.matrix.api import new_txn
from gpubot.matrix.ids import split_ref
from gpubot.matrix.poster import MatrixPoster, post_once
from gpubot.matrix.render import edit_of
from gpubot.services.outbox import Outbox

log = logging.getLogger(__name__)


class MatrixAlerts(AlertTeller):
    """Alerts in one Matrix room (``chat.alert_teller``): replies in threads (``m.thread``),
    edits (``m.replace``)."""

    def __init__(
        self,
        poster: MatrixPoster,
        room: str,
        *,
        people: Mapping[str, Sequence[str]],
        outbox: Outbox[Message],
        route: DmRoute | None = None,
    ) -> None:
        super().__init__(poster, room, people=people, outbox=outbox, route=route)
        self.api = poster.api

    async def reply(self, where: MessageRef, msg: Message, *, broadcast: bool = False) -> bool:
        """Post ``msg`` in the thread of ``where`` (Matrix shows no thread reply in the room);
        False (logged) if it did not get there. A reply whose answer is lost is not resent."""
        posted = await post_once(self.api, where, msg, token=new_txn())
        return posted.delivery is Delivery.POSTED

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
