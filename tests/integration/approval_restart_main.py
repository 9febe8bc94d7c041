"""``gpubot serve`` without its listener, as a process a test can SIGKILL in an approved kill's
grace wait and start again (``test_approval_restart.py``).

    python -m tests.integration.approval_restart_main CONFIG DB_URL SLACK_API_URL OWNER MODE

It builds the real composition (``gpubot.app.build`` with Slack access and ``serving=True``) and
runs ``App.running`` with the bot's approval duty, as ``serve`` does: the start-up report, then
the duty every ``EVERY_S``. MODE ``approve``: plan a forced kill of GPU 0 on node1, ask for it
as U0OWNER, post the request, and approve it as U0CAROL (it then runs: a stubborn process keeps
it in its grace wait). MODE ``serve``: only the lifecycle. Prints one JSON line per event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpubot.app import build
from gpubot.chat.reset_view import render_approval_request
from gpubot.config import LeaseSettings, Settings
from gpubot.core.commands import Reset
from gpubot.core.policy import Person
from gpubot.lifecycle import Serving
from gpubot.services.alert_keeper import NoAlerts
from gpubot.services.reset import Ask
from gpubot.slack.app import GpuBot
from gpubot.slack.front import SlackAccess, SlackFront
from gpubot.slack.render import NeutralSurface, to_slack
from gpubot.slack.serve import SlackParts, build_bot
from tests.fixtures.slack import BOT_TOKEN, slack_settings_for

TTL_S, RENEW_S = 12.0, 0.5  # a killed holder's lease lapses this long after its last renewal
GRACE_S = 60.0  # the stubborn process keeps the approved kill in its grace wait this long
EVERY_S = 0.3  # the approval duty's interval
OWNER = Person("U0OWNER", "owner", None)
CAROL = Person("U0CAROL", "carol", "carol")


def emit(event: str, **data: Any) -> None:
    """Print one event line."""
    print(json.dumps({"event": event, "t": time.time(), **data}), flush=True)


def settings(config: str, db_url: str, owner: str) -> Settings:
    """The Slack tests' settings of the fleet, on ``db_url``, with a short lease."""
    s: Settings = slack_settings_for(Path(config), owner)
    leases = LeaseSettings(ttl_s=TTL_S, renew_s=RENEW_S)
    return dataclasses.replace(s, database_url=db_url, leases=leases)


async def approve(bot: GpuBot, s: Settings) -> None:
    """Ask for a forced kill of GPU 0 on node1 as U0OWNER, post it, approve it as U0CAROL."""
    approvals = bot.flows.svc.approvals
    assert approvals is not None
    ask = Reset("node1", gpus=(0,), grace_s=GRACE_S)
    plan, _ = await approvals.plan(OWNER, ask)
    assert plan.forced, plan
    a = await approvals.open(Ask(OWNER, "/gpu reset node1", "slack", GRACE_S), plan)
    msg = render_approval_request(a.id, plan, OWNER.id, None, a.expires_at.timestamp())
    channel = s.policy.approval_channel or "C0ONCALL"
    handle = await bot.api.post(channel, to_slack(msg))
    assert handle is not None
    await approvals.approvals.set_message(a.id, handle)
    channel_of, _, ts = handle.partition("/")
    emit("approving", approval=a.id, channel=channel_of, ts=ts)
    out = NeutralSurface(bot.api, channel=channel, user=CAROL.id, response_url=None)
    await bot.flows.decide(a.id, True, CAROL, out, handle=handle)
    emit("decided", approval=a.id)


async def main(config: str, db_url: str, api_url: str, owner: str, mode: str) -> None:
    """Run until killed (or, in ``approve``, until the approved kill ends)."""
    s = settings(config, db_url, owner)
    front = SlackFront(SlackAccess(BOT_TOKEN, api_url), min_update_s=0.0)
    options = Serving(sweeps=False, expire_every_s=EVERY_S, settle_heap=False)
    app = build(s, {}, need_store=True, front=front, serving=options)
    try:
        bot = build_bot(SlackParts(app.flows, front.api, NoAlerts()), None)
        async with app.running():
            emit("ready", mode=mode)
            if mode == "approve":
                await approve(bot, s)
            await asyncio.Event().wait()
    finally:
        await app.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
