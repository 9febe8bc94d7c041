"""The app's sweeps against a fake Slack, as a process a test can SIGKILL mid-post.

    python -m tests.integration.outbox_main CONFIG DB_URL SLACK_API_URL ORDER SWEEPS

It builds the real composition (``gpubot.app.build`` with Slack access, as ``gpubot serve``
does) and runs SWEEPS alerting sweeps one after the other, printing one JSON line after each
(``swept``, with the keys alerted). ORDER ``outbox`` is gpubot's sweep service; ``post-first``
is the order before the outbox (post, then record: ``PostThenRecord``, an alert keeper
without it), the control.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from gpubot.app import build
from gpubot.chat.alerts import render_alert_group
from gpubot.config import Settings, load
from gpubot.core.alerting import Alert, AlertGroup, AlertItem
from gpubot.core.findings import Finding, FindingKey
from gpubot.core.reset.readiness import Readiness
from gpubot.services.alert_keeper import AlertKeeper
from gpubot.services.sweep import SweepService
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi
from gpubot.slack.front import SlackAccess, SlackFront
from gpubot.slack.render import to_slack
from tests.fixtures.settings import sweep_ports, with_tables
from tests.fixtures.slack import BOT_TOKEN, slack_api

CHANNEL = "C0ALERTS"


def outbox_settings(config: Path, db_url: str) -> Settings:
    """The fleet's settings with an alert channel and generous timeouts."""
    s = load(config)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=10.0, connect_timeout_s=5.0)
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh)
    return with_tables(s, {"sweep": {"interval_s": 60}, "alerts": {"channel": CHANNEL}})


class PostThenRecord(AlertKeeper):
    """The alert keeper with the outbox taken out: post (as ``SlackApi.post`` does, with the
    client's retries), then record ``mark_alerted``; a lost answer leaves nothing recorded."""

    api: SlackApi

    async def _post(
        self,
        new: Mapping[str, list[Finding]],
        states: dict[FindingKey, Alert],
        ready: Mapping[tuple[str, int], Readiness],
        now: datetime,
    ) -> tuple[FindingKey, ...]:
        alerted: list[FindingKey] = []
        for node, fs in new.items():
            items = tuple(AlertItem(f.key, f, states[f.key].first_seen) for f in fs)
            try:
                where = await self.api.post(
                    CHANNEL, to_slack(render_alert_group(AlertGroup(node, items, None, now)))
                )
            except Exception:  # a timeout: slack_sdk raises it through SlackApi.post
                where = None
            if where is None:
                continue
            for f in fs:
                states[f.key] = await self.alerts.mark_alerted(f.key, ref=where, now=now)
                alerted.append(f.key)
        return tuple(alerted)


def post_then_record(
    settings: Settings, app: Any, slack_url: str, *, timeout: int | None = None
) -> SweepService:
    """Return the control's sweep service over ``app``'s store and Slack at ``slack_url``
    (``timeout``: its Web API client's, in seconds; None: the product's)."""
    api = slack_api(slack_url, timeout=timeout)
    notifier = SlackAlerts(api, CHANNEL)
    ports = sweep_ports(settings, app.store, notifier=notifier, keeper=PostThenRecord)
    assert isinstance(ports.keeper, PostThenRecord)
    ports.keeper.api = api
    return SweepService(settings, app.status, app.transport, ports, replica="control")


async def main(config: str, db_url: str, slack_url: str, order: str, sweeps: int) -> None:
    """Run ``sweeps`` alerting sweeps."""
    s = outbox_settings(Path(config), db_url)
    front = SlackFront(SlackAccess(BOT_TOKEN, slack_url))
    app = build(s, {}, need_store=True, front=front)
    svc = app.sweep if order == "outbox" else post_then_record(s, app, slack_url)
    try:
        for _ in range(sweeps):
            result = await svc.run()
            print(
                json.dumps({"event": "swept", "alerted": [k.text() for k in result.alerted]}),
                flush=True,
            )
    finally:
        await app.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
