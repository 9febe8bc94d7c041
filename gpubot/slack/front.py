"""Slack as the composition root builds on it (``app.front.FrontEnd``): every outlet over one
Web API adapter, whose one HTTP session (connection pool) ``close`` ends. ``gpubot serve`` chose
Slack and passes it in; the root names no front end."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpubot.chat.dm_route import DmRoute
from gpubot.chat.message import Message, Section, paragraph
from gpubot.chat.surface import MIN_UPDATE_S
from gpubot.config import Settings
from gpubot.core.ports import Report
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import TIMEOUT_S, SlackApi, SlackDirectory, make_client
from gpubot.slack.poster import SlackPoster
from gpubot.slack.render import NeutralSurface, to_slack

if TYPE_CHECKING:
    from gpubot.chat.claims import Dm
    from gpubot.services.outbox import Outbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlackAccess:  # read from the environment by serve
    bot_token: str
    api_url: str
    timeout_s: int = TIMEOUT_S


class SlackFront:
    """Slack's outlets for the root: alerts, DMs, approval posts."""

    name = "slack"

    def __init__(self, access: SlackAccess, *, min_update_s: float = MIN_UPDATE_S) -> None:
        self.min_update_s = min_update_s
        self.api = SlackApi(
            make_client(
                access.bot_token, access.api_url, timeout=access.timeout_s, shared_session=True
            )
        )

    def surface(self) -> NeutralSurface:
        return NeutralSurface(self.api, channel=None, user="", response_url=None)

    def reporter(self, settings: Settings) -> SlackReporter:
        return SlackReporter(self.api, settings.policy.channel)

    def directory(self) -> SlackDirectory:
        return SlackDirectory(self.api.client)

    def dm(self, outbox: Outbox[Message]) -> Dm:
        """Direct messages, each once through ``outbox`` (without a database: at most once)."""

        async def dm(user: str, msg: Message, subject: str) -> bool:
            channel = await self.api.open_dm(user)
            if channel is None:  # not sent: the duty asks again on its next turn
                return False
            return await outbox.send_once(subject, channel, msg)

        return dm

    def poster(self) -> SlackPoster:
        return SlackPoster(self.api)

    def alerts(
        self, settings: Settings, outbox: Outbox[Message], route: DmRoute
    ) -> SlackAlerts | None:
        """Sweep alerts in ``[alerts] channel`` (else ``[slack] channel``); none without."""
        channel = settings.sweep.channel
        if channel is None:
            log.warning("no [alerts] or [slack] channel: sweeps run, but nothing is posted")
            return None
        people = settings.policy.chat_ids()
        return SlackAlerts(self.api, channel, people=people, outbox=outbox, route=route)

    async def close(self) -> None:
        await self.api.close()


class SlackReporter:
    """The ``Reporter`` port: tells a report in ``[slack] channel``."""

    def __init__(self, api: SlackApi, channel: str | None) -> None:
        self.api = api
        self.channel = channel

    async def report(self, report: Report) -> None:
        msg = Message(report.title, (Section(paragraph(report.text())),))
        if self.channel is None:
            log.warning("no [slack] channel configured: not posted: %s", to_slack(msg)["text"])
            return
        await self.api.post(self.channel, to_slack(msg))
