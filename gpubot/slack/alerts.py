"""Sweep alerts in Slack: posting, updating, reminding, and the snooze buttons.

A kind found on several nodes is one digest: a short channel message, and each finding's details
and buttons as replies in its thread, posted only once the digest is known to be in the channel
(answered, or found in the history after a lost answer). Every call to a channel is paced to
about one a second there (Slack's per-channel limit). An idle-holder alert is also sent once as
a DM to each owner; a DM that cannot be sent is logged and changes nothing else. Alerts and DMs
are posted once through the one outbox (``slack.poster``, ``services.outbox``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpubot.chat.alert_digest import is_digest, render_alert, render_digest_details
from gpubot.chat.alerts import SNOOZE_ACTION, render_reminder
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.holders import snooze
from gpubot.chat.idle import tell_idle_owners
from gpubot.chat.message import Message
from gpubot.core.alerting import AlertGroup, Delivery, Lookup, MessageRef, Posted
from gpubot.errors import ChatCallFailed
from gpubot.services.alert_keeper import Snoozer
from gpubot.services.outbox import Outbox
from gpubot.slack.api import SlackApi, call
from gpubot.slack.ids import split_ref
from gpubot.slack.poster import SlackPoster
from gpubot.slack.render import to_slack

if TYPE_CHECKING:
    from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)

POST_INTERVAL_S = 1.0  # Slack's chat.postMessage limit: about one message per second per channel


class SlackAlerts:
    """Posts, updates and reminds alert messages in one channel (``Notifier``). ``people``:
    Linux user → Slack user ids, whose idle holders are told by DM once each (``outbox``)."""

    def __init__(
        self,
        api: SlackApi,
        channel: str,
        *,
        people: Mapping[str, Sequence[str]] | None = None,
        outbox: Outbox[Message] | None = None,
        route: DmRoute | None = None,
    ) -> None:
        self.api = api
        self.channel = channel
        self.people = people or {}
        self.route = route  # how another front end's people get their DMs (None: they do not)
        self.poster = SlackPoster(api)
        self.outbox = outbox or Outbox(None, self.poster)
        self._posted_at: dict[str, float] = {}  # channel → when this notifier last posted there
        self._unsure: dict[str, AlertGroup] = {}  # token → a digest whose post is unconfirmed

    @asynccontextmanager
    async def _paced(self, channel: str) -> AsyncIterator[None]:
        """Wait until ``channel`` had no post from here for the interval, counted from when
        the last call there ended: Slack saw it by then."""
        loop = asyncio.get_running_loop()
        last = self._posted_at.get(channel)
        if last is not None and (wait := last + POST_INTERVAL_S - loop.time()) > 0:
            await asyncio.sleep(wait)
        try:
            yield
        finally:
            self._posted_at[channel] = loop.time()

    async def _reply(self, where: MessageRef, msg: Mapping[str, Any], **extra: Any) -> bool:
        """Post ``msg`` in the thread of ``where`` (paced); False (logged) if refused."""
        channel, ts = split_ref(where)
        async with self._paced(channel):
            try:
                await call(
                    self.api.client,
                    "chat.postMessage",
                    channel=channel,
                    thread_ts=ts,
                    **extra,
                    **msg,
                )
                return True
            except ChatCallFailed as exc:
                log.error("reply in %s failed: %s", where, exc.error)
                return False

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        """Post a new alert message carrying ``token`` in its metadata (``slack.poster``);
        once Slack has answered that it took it, DM the idle holders' owners."""
        async with self._paced(self.channel):
            posted = await self.poster.post(self.channel, render_alert(group), token=token)
        if posted.delivery is Delivery.UNCERTAIN and is_digest(group):
            self._unsure[token] = group  # its details follow if the history has it
        if posted.delivery is Delivery.POSTED:  # once per finding: the DM rides on its alert
            try:
                if posted.ref is not None:
                    await self.details(posted.ref, group)
                await self.direct(group, posted.ref)
            except Exception:  # what follows an alert never fails a sweep
                log.exception("details or direct messages of the alert on %s failed", group.node)
        return posted

    async def find(self, token: str, since: datetime) -> Lookup:
        """Look for the alert carrying ``token``; a digest of this process found in the history
        gets its details in its thread."""
        lookup = await self.poster.find(self.channel, token, since)
        if lookup.checked or lookup.ref is not None:
            group = self._unsure.pop(token, None)
            if group is not None and lookup.ref is not None:
                try:
                    await self.details(lookup.ref, group)
                except Exception:  # never fails the search
                    log.exception("details of the digest %s failed", group.node)
        return lookup

    async def details(self, where: MessageRef, group: AlertGroup) -> int:
        """Post a digest's details in its thread (nothing for a node's own alert); return
        the replies posted. A reply whose answer is lost is not resent (``api.retry_handlers``)."""
        if not is_digest(group):
            return 0
        return sum([await self._reply(where, to_slack(m)) for m in render_digest_details(group)])

    async def direct(self, group: AlertGroup, where: MessageRef | None) -> int:
        """DM each owner of the group's open idle holders (``chat.idle.tell_idle_owners``);
        return how many DMs were sent or handed over."""
        return await tell_idle_owners(group, where, self.people, self._dm, self.route)

    async def _dm(self, user: str, msg: Message, subject: str) -> bool:
        """Post an idle DM to a Slack user, paced (due once: it rides on its alert, which the
        outbox posts once; delivered once)."""
        channel = await self.api.open_dm(user)
        if channel is None:
            return False
        async with self._paced(channel):
            return await self.outbox.send(subject, channel, msg) is not None

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        """Replace an alert message by the group's current state (paced)."""
        async with self._paced(split_ref(where)[0]):
            await self.api.update(where, to_slack(render_alert(group)))

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        await self._reply(where, to_slack(render_reminder(group)), reply_broadcast=True)


def register(bot: GpuBot, service: Snoozer) -> None:
    """Handle the snooze buttons of alert messages in ``bot``."""

    async def on_snooze(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        m = SNOOZE_ACTION.match(str(action.get("action_id")))
        if m is None:
            return
        by = f"slack:{(body.get('user') or {}).get('id', '')}"
        key, out = str(action.get("value")), bot.surface(body)
        bot.spawn(snooze(service.snooze, key, m[1], by=by, out=out), f"snooze {m[1]}")

    bot.app.action(SNOOZE_ACTION)(on_snooze)
