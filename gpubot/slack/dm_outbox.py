"""Direct messages and the ladder's channel posts posted once, through the alerts' outbox
(issues 22, 34).

The idle holders' DMs (``slack.alerts``), the reclaim ladder's (``slack.ladder``) and the
claims' (``slack.claims``: a free GPU held for a waiter, an idle claim's Keep / Release, an
intruder) each go through ``AlertOutbox.publish`` under a subject naming that one DM
("dm:idle:node1:2:4242:…:U0ALICE"): its intent is recorded with a token that rides in the
message metadata (``DM_EVENT``), then it is posted (``post_once``: no retry that could post
twice), then marked posted. After an uncertain post (a timeout, a 5xx) the DM's history is
searched for the token (``find_post``; ``im:history``) before anything is posted again: found,
it is adopted; provably absent, posted again with the same token; if the history cannot be
read, posted once more saying "this may repeat the message of HH:MM", and no more.

What decides that a DM is due at all stays with its caller (the alert posted once, the claims'
and the ladder's conditional updates); this adds only the delivery. A DM that any process may
find due, more than once (``send_once``: the claims' duty, which delivers holds that the CLI
recorded, and asks again on its next turn until one is known delivered), is one row per subject
(``AlertOutbox.publish_once``). The ladder's channel posts
(steps 3 and 4) take the same road with their own ``event``. Without a database there is no
outbox: the message is posted at most once, as before.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from gpubot.chat.approval_duty import may_repeat
from gpubot.chat.message import Message
from gpubot.core.alerting import Delivery, Handle, Lookup, Posted, new_token
from gpubot.core.ports import AlertStore
from gpubot.errors import GpubotError
from gpubot.services.alert_outbox import AlertOutbox, Find, Send
from gpubot.slack.api import SlackApi
from gpubot.slack.outbox import DM_EVENT, find_post, post_once
from gpubot.slack.render import to_slack

log = logging.getLogger(__name__)


class DmPoster:
    """Posts direct messages once each (with an ``AlertStore``), else at most once."""

    def __init__(self, api: SlackApi, alerts: AlertStore | None) -> None:
        self.api = api
        self.outbox = AlertOutbox(alerts) if alerts is not None else None

    async def send(
        self, subject: str, channel: str, msg: Message, *, event: str = DM_EVENT
    ) -> Handle | None:
        """Post ``msg`` to ``channel`` (a DM, unless told) once under ``subject``; return where
        it is (None: refused, not confirmed, or the outbox could not be written: nothing
        posted). Its time is Slack's (the wall clock): the history is searched from it."""
        if self.outbox is None:
            return (await self._at_most_once(channel, msg, event)).handle
        send, find = self._calls(channel, msg, event)
        try:
            return await self.outbox.publish(subject, send, find, datetime.now(UTC), repeat=True)
        except GpubotError as exc:  # the outbox cannot be written: nothing was posted
            log.error("the DM %s was not sent: %s", subject, exc)
            return None

    async def send_once(
        self, subject: str, channel: str, msg: Message, *, event: str = DM_EVENT
    ) -> bool:
        """Post ``msg`` of ``subject``, due to any process and maybe more than once, once in
        all (``AlertOutbox.publish_once``); return whether it is known to be there (posted now
        or before). False (refused, unconfirmed, being posted elsewhere, or the outbox could
        not be written): the caller asks again on a later turn, and it is tried again, never
        posted twice. Without an outbox, at most once: an uncertain post counts as there."""
        if self.outbox is None:
            posted = await self._at_most_once(channel, msg, event)
            return posted.delivery is not Delivery.REFUSED
        send, find = self._calls(channel, msg, event)
        try:
            return await self.outbox.publish_once(subject, send, find, datetime.now(UTC))
        except GpubotError as exc:  # the outbox cannot be written: nothing was posted
            log.error("the DM %s was not sent (tried again later): %s", subject, exc)
            return False

    async def _at_most_once(self, channel: str, msg: Message, event: str) -> Posted:
        """Without an outbox: one post, with a token but no record of it."""
        return await post_once(self.api, channel, to_slack(msg), token=new_token(), event=event)

    def _calls(self, channel: str, msg: Message, event: str) -> tuple[Send, Find]:
        """Return the post (with its token; saying it may repeat when told) and the search."""

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            shown = msg if repeat_of is None else may_repeat(msg, repeat_of)
            return await post_once(self.api, channel, to_slack(shown), token=token, event=event)

        async def find(token: str, since: datetime) -> Lookup:
            return await find_post(self.api.client, channel, token, since, event=event)

        return send, find
