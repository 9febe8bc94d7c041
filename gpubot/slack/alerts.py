"""Sweep alerts in Slack: how a reply goes in a thread and an alert is edited, the pacing, and
the snooze buttons; what every front end does alike is ``chat.alert_teller``'s.

Every call to a channel is paced to about one a second there (Slack's per-channel limit). Alerts
and DMs are posted once through the one outbox (``slack.poster``, ``services.outbox``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from gpubot.chat.alert_digest import render_alert
from gpubot.chat.alert_teller import AlertTeller
from gpubot.chat.alerts import SNOOZE_ACTION
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.holders import snooze
from gpubot.chat.message import Message
from gpubot.core.alerting import AlertGroup, MessageRef
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


class SlackAlerts(AlertTeller):
    """Alerts in one Slack channel (``chat.alert_teller``): replies in threads through
    ``chat.postMessage``, edits through ``chat.update``, every call to a channel paced."""

    def __init__(
        self,
        api: SlackApi,
        channel: str,
        *,
        people: Mapping[str, Sequence[str]] | None = None,
        outbox: Outbox[Message] | None = None,
        route: DmRoute | None = None,
    ) -> None:
        poster = SlackPoster(api)
        outbox = outbox or Outbox(None, poster)
        super().__init__(poster, channel, people=people or {}, outbox=outbox, route=route)
        self.api = api
        self._posted_at: dict[str, float] = {}  # channel → when this notifier last posted there

    @property
    def channel(self) -> str:
        return self.place

    @asynccontextmanager
    async def paced(self, place: str) -> AsyncIterator[None]:
        """Wait until ``place`` had no post from here for the interval, counted from when the
        last call there ended: Slack saw it by then."""
        loop = asyncio.get_running_loop()
        last = self._posted_at.get(place)
        if last is not None and (wait := last + POST_INTERVAL_S - loop.time()) > 0:
            await asyncio.sleep(wait)
        try:
            yield
        finally:
            self._posted_at[place] = loop.time()

    async def reply(self, where: MessageRef, msg: Message, *, broadcast: bool = False) -> bool:
        """Post ``msg`` in the thread of ``where`` (paced; ``broadcast``: also in the channel);
        a reply whose answer is lost is not resent (``api.retry_handlers``)."""
        channel, ts = split_ref(where)
        extra = {"reply_broadcast": True} if broadcast else {}
        async with self.paced(channel):
            try:
                body = to_slack(msg)
                await call(
                    self.api.client,
                    "chat.postMessage",
                    channel=channel,
                    thread_ts=ts,
                    **extra,
                    **body,
                )
                return True
            except ChatCallFailed as exc:
                log.error("reply in %s failed: %s", where, exc.error)
                return False

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        """Replace an alert message by the group's current state (paced)."""
        async with self.paced(split_ref(where)[0]):
            await self.api.update(where, to_slack(render_alert(group)))


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
