"""The weekly GPU-hours digest in Slack: posted with its token, found again by it
(``services.digest``; posted once through ``slack.poster``)."""

from __future__ import annotations

from datetime import datetime

from gpubot.chat.report_view import render_usage
from gpubot.core.alerting import Lookup, Posted
from gpubot.core.usage.report import UsageReport
from gpubot.slack.api import SlackApi
from gpubot.slack.poster import find_post, post_once
from gpubot.slack.render import to_slack


class SlackDigest:
    """Posts the digest in one channel (implements ``DigestNotifier``)."""

    def __init__(self, api: SlackApi, channel: str) -> None:
        self.api = api
        self.channel = channel

    async def post(self, report: UsageReport, *, token: str) -> Posted:
        """Post the digest carrying ``token`` in its metadata."""
        msg = to_slack(render_usage(report, title="Weekly GPU-hours"))
        return await post_once(self.api, self.channel, msg, token=token)

    async def find(self, token: str, since: datetime) -> Lookup:
        """Look for the digest carrying ``token`` in the channel since ``since``."""
        return await find_post(self.api.client, self.channel, token, since)
