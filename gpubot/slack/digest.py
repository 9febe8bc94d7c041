"""The weekly GPU-hours digest in Slack, posted and found through the outbox's ``SlackPoster``."""

from __future__ import annotations

from datetime import datetime

from gpubot.chat.report_view import render_usage
from gpubot.core.alerting import Lookup, Posted
from gpubot.core.usage.report import UsageReport
from gpubot.slack.api import SlackApi
from gpubot.slack.poster import SlackPoster


class SlackDigest:
    """Posts the digest in one channel (implements ``DigestNotifier``)."""

    def __init__(self, api: SlackApi, channel: str) -> None:
        self.poster = SlackPoster(api)
        self.channel = channel

    async def post(self, report: UsageReport, *, token: str) -> Posted:
        msg = render_usage(report, title="Weekly GPU-hours")
        return await self.poster.post(self.channel, msg, token=token)

    async def find(self, token: str, since: datetime) -> Lookup:
        return await self.poster.find(self.channel, token, since)
