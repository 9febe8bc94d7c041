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
find due, more than once (``once``: the claims' duty, which delivers holds that the CLI
recorded), is one row per subject (``AlertOutbox.publish_once``). The ladder's channel posts
(steps 3 and 4) take the same road with their own ``event``. Without a database there is no
outbox: the message is posted at most once, as before.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from gpubot.chat.approval_duty import may_repeat
from gpubot.chat.message import Message
from gpubot.core.alerting import Handle, Lookup, Posted
from gpubot.core.ports import AlertStore
from gpubot.errors import GpubotError
from gpubot.services.alert_outbox import AlertOutbox
from gpubot.slack.api import SlackApi
from gpubot.slack.outbox import DM_EVENT, find_post, new_token, post_once
from gpubot.slack.render import to_slack

log = logging.getLogger(__name__)


class DmPoster:
    """Posts direct messages once each (with an ``AlertStore``), else at most once."""

    def __init__(self, api: SlackApi, alerts: AlertStore | None) -> None:
        self.api = api
        self.outbox = AlertOutbox(alerts) if alerts is not None else None

    async def send(
        self,
        subject: str,
        channel: str,
        msg: Message,
        *,
        event: str = DM_EVENT,
        once: bool = False,
    ) -> Handle | None:
        """Post ``msg`` to ``channel`` (a DM, unless told) once under ``subject``; return where
        it is (None: refused, not confirmed, done before (``once``), or the outbox could not be
        written: nothing posted). Its time is Slack's (the wall clock): the history is searched
        from it."""
        if self.outbox is None:
            plain = to_slack(msg)
            posted = await post_once(self.api, channel, plain, token=new_token(), event=event)
            return posted.handle

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            shown = msg if repeat_of is None else may_repeat(msg, repeat_of)
            return await post_once(self.api, channel, to_slack(shown), token=token, event=event)

        async def find(token: str, since: datetime) -> Lookup:
            return await find_post(self.api.client, channel, token, since, event=event)

        try:
            now = datetime.now(UTC)
            if once:
                return await self.outbox.publish_once(subject, send, find, now)
            return await self.outbox.publish(subject, send, find, now, repeat=True)
        except GpubotError as exc:  # the outbox cannot be written: nothing was posted
            log.error("the DM %s was not sent: %s", subject, exc)
            return None
