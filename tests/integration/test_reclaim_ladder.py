"""The reclaim ladder on the simulated fleet, over hours of a clock the test moves.

The bot runs as ``gpubot serve`` wires it (HTTP, a fresh SQLite database, the fake Web API);
its sweeps get the test's clock, 15 minutes a sweep. Two idle hoarders of the owner climb the
ladder: one to the end (DM, reminder, channel post, on-call's *Free it*, whose approval by a
second on-call kills that one process and nothing else), the other stopped at once by the
owner's *Keep (reason)* (a signed modal submission). Every step is in the audit chain. Also
``/gpu report by node`` as a signed slash command.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.app import App, build
from gpubot.chat.idle import ACTION_FREE
from gpubot.chat.ladder import ACTION_KEEP, ACTION_ONCALL_FREE
from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_DENY
from gpubot.core.findings import IDLE_HOLDER
from gpubot.core.usage.ladder import LadderRule
from gpubot.slack.ladder import KEEP_VIEW, REASON_BLOCK, REASON_INPUT
from gpubot.slack.serve import start_http
from gpubot.store.tables import outbox
from gpusim.fleet import SimFleet
from tests.fixtures.db import audit_rows
from tests.fixtures.settings import ManualClock, with_sweep
from tests.fixtures.slack import (
    SECRET,
    Call,
    FakeSlack,
    Harness,
    SlackSender,
    assert_within_limits,
    owned,
    slack_bot,
    slack_front,
)

INTERVAL = 900
SWEEP = {"interval_s": INTERVAL, "idle_hours": 1, "idle_min_mib": 4096, "keep_samples": "1d"}
LADDER = LadderRule(True, remind_after_s=1800, post_after_s=1800, offer_after_s=900)


class LadderSlack(FakeSlack):
    """The fake Web API, plus ``conversations.open`` (D + the user's id) and ``views.open``."""

    def _answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "conversations.open":
            return {"ok": True, "channel": {"id": f"D{str(body.get('users'))[1:]}"}}
        if method == "views.open":
            return {"ok": True, "view": {"id": "V0KEEP"}}
        return super()._answer(method, body)


@pytest.fixture
async def fake() -> AsyncIterator[LadderSlack]:
    f = LadderSlack()
    f.groups["S0ONCALL"] = ["U0DAVE"]  # dave is on call too: he approves carol's request
    await f.start()
    yield f
    await f.stop()


@pytest.fixture
def node1(slack_fleet: SimFleet) -> Iterator[Any]:
    from tests.fixtures.fleet import leave_clean

    yield owned(slack_fleet, "node1")
    leave_clean(slack_fleet.node("node1"))


@asynccontextmanager
async def serving(
    settings: Any, fake: FakeSlack, db_url: str, clock: ManualClock
) -> AsyncIterator[tuple[Harness, App]]:
    settings = with_sweep(dataclasses.replace(settings, database_url=db_url), **SWEEP)
    settings = dataclasses.replace(settings, ladder=LADDER)
    front = slack_front(fake, min_update_s=0.05)
    app = build(settings, {}, need_store=True, front=front)
    sweep = app.sweep
    assert sweep.keeper is not None and sweep.idle is not None and sweep.ladder is not None
    sweep.clock = sweep.keeper.clock = sweep.idle.clock = sweep.ladder.clock = clock
    assert app.chat.usage is not None
    app.chat.usage.clock = clock
    bot = slack_bot(app, front)
    runner = await start_http(bot, "127.0.0.1", 0, "/slack/events")
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    try:
        yield Harness(bot, fake, SlackSender(url, SECRET, fake), app.store, url, app), app
    finally:
        await bot.drain()
        await runner.cleanup()
        await app.close()


def blocks_of(call: Call) -> list[dict[str, Any]]:
    b = call.body.get("blocks") or []
    return json.loads(b) if isinstance(b, str) else list(b)


def buttons(call: Call) -> list[tuple[str, str]]:
    return [
        (e["action_id"], e["value"])
        for b in blocks_of(call)
        if b["type"] == "actions"
        for e in b["elements"]
    ]


def posts(fake: FakeSlack, channel: str) -> list[Call]:
    return [c for c in fake.ok("chat.postMessage") if c.body["channel"] == channel]


def outbox_states(app: App, prefix: str) -> list[str]:
    """Return the states of the outbox's message posts whose subject starts with ``prefix``."""
    assert app.store is not None
    with app.store.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox).order_by(outbox.c.id)).all()
    return [r.state for r in rows if str(r.subject).startswith(prefix)]


def ladder_records(db_url: str) -> list[tuple[str, str, str]]:
    """Return (what, finding, actor) of every ladder record in the audit chain, in order."""
    out = []
    for r in audit_rows(db_url):
        if r.kind == "ladder":
            data = json.loads(r.payload)
            out.append((data["ladder"], data["key"], r.actor))
    return out


async def submit_keep(h: Harness, user: str, key: str, reason: str) -> int:
    """Send the Keep modal's submission, signed, as Slack would; return the HTTP status."""
    payload = {
        "type": "view_submission",
        "team": {"id": "T0FAKE", "domain": "fake"},
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0FAKE"},
        "api_app_id": "A0GPUBOT",
        "token": "legacy-verification-token",
        "trigger_id": "9.9.trigger",
        "view": {
            "id": "V0KEEP",
            "type": "modal",
            "callback_id": KEEP_VIEW,
            "private_metadata": key,
            "state": {
                "values": {
                    REASON_BLOCK: {REASON_INPUT: {"type": "plain_text_input", "value": reason}}
                }
            },
        },
    }
    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    reply = await h.send.send(body, "application/x-www-form-urlencoded")
    await h.settle()
    return reply.status


async def test_the_whole_ladder_then_free_it_through_the_approval(
    slack_fleet: SimFleet, slack_settings: Any, fake: LadderSlack, node1: Any, tmp_path: Path
) -> None:
    hoarder = node1.spawn(gpu=0, mib=8192, util_pct=0)
    small = node1.spawn(gpu=0, mib=512, util_pct=0)  # on the same GPU: not a target
    kept = node1.spawn(gpu=2, mib=8192, util_pct=0)  # the owner keeps this one
    busy = node1.spawn(gpu=1, mib=8192, util_pct=80)
    db_url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    start = time.time() - 3 * 3600
    clock = ManualClock(start)
    async with serving(slack_settings, fake, db_url, clock) as (h, app):

        async def sweep_at(minutes: int) -> set[str]:
            clock.t = start + minutes * 60
            result = await app.sweep.run()  # a scheduled sweep's work, on the test's clock
            assert result.failed == {}
            return {f.key.text() for f in result.findings if f.kind is IDLE_HOLDER}

        for m in (0, 15, 30, 45):
            assert await sweep_at(m) == set()
        assert fake.ok("chat.postMessage") == []
        idle = await sweep_at(60)  # an hour at 0 %: step 1, a DM each, no channel alert
        a = next(k for k in idle if f'"{hoarder.pid}:' in k)
        b = next(k for k in idle if f'"{kept.pid}:' in k)
        dms = posts(fake, "D0OWNER")
        assert len(dms) == 2 and posts(fake, "C0GENERAL") == []
        assert outbox_states(app, "dm:ladder:") == ["posted", "posted"]  # each DM once (#22)
        first = next(c for c in dms if (ACTION_KEEP, a) in buttons(c))
        assert buttons(first) == [(ACTION_FREE, a), (ACTION_KEEP, a)]
        said = json.dumps(blocks_of(first), ensure_ascii=False)
        assert "held idle 1.00 GPU-hours: 5 sample(s) at 0 %" in said, said

        # Keep (reason) for the second: the modal opens, its submission stops that ladder;
        # someone else's submission is refused and changes nothing
        kept_dm = next(c for c in dms if (ACTION_KEEP, b) in buttons(c))
        await h.send.click(
            ACTION_KEEP, b, user="U0OWNER", channel="D0OWNER", message_ts=str(kept_dm.answer["ts"])
        )
        await h.settle()
        (opened,) = fake.ok("views.open")
        view = opened.body["view"]
        view = json.loads(view) if isinstance(view, str) else view
        assert view["callback_id"] == KEEP_VIEW and view["private_metadata"] == b
        assert await submit_keep(h, "U0BOB", b, "not mine but keep it") == 200
        refused = json.dumps(fake.ok("chat.postEphemeral")[-1].body)
        assert f"only {hoarder.user}, whose job holds it, can keep this GPU" in refused
        assert await submit_keep(h, "U0OWNER", b, "  eval run   resumes at 18:00 ") == 200
        rungs = await app.sweep.ladder.store.rungs()  # type: ignore[union-attr]
        assert rungs[b].kept and rungs[b].kept_reason == "eval run resumes at 18:00"
        assert not rungs[a].kept

        assert await sweep_at(75) == {a, b}
        assert len(posts(fake, "D0OWNER")) == 2  # no reminder yet
        await sweep_at(90)  # step 2 for the first only
        reminder = posts(fake, "D0OWNER")[-1]
        assert "Reminder: your job holds node1 GPU 0 idle" in reminder.body["text"]
        await sweep_at(105)
        assert posts(fake, "C0GENERAL") == []
        await sweep_at(120)  # step 3: the channel names the holder
        (named,) = posts(fake, "C0GENERAL")
        assert named.body["text"] == f"node1 GPU 0 held idle by {hoarder.user}"
        assert "<@U0OWNER>" in json.dumps(blocks_of(named))
        assert buttons(named) == []
        await sweep_at(135)  # step 4: Free it for on-call
        offer = posts(fake, "C0GENERAL")[-1]
        assert buttons(offer) == [(ACTION_ONCALL_FREE, a)]
        await sweep_at(150)  # nothing more: never an automatic kill
        assert len(posts(fake, "C0GENERAL")) == 2 and hoarder.alive()
        assert len(posts(fake, "D0OWNER")) == 3  # the kept one was never reminded

        # carol (on call) clicks Free it: a request for the approvers, with the idle evidence
        await h.send.click(
            ACTION_ONCALL_FREE,
            a,
            user="U0CAROL",
            channel="C0GENERAL",
            message_ts=str(offer.answer["ts"]),
        )
        await h.settle()
        (request,) = posts(fake, "C0ONCALL")
        text = json.dumps(blocks_of(request), ensure_ascii=False)
        assert "Idle evidence: held idle 2.50 GPU-hours: 11 sample(s) at 0 %" in text, text
        assert "8704 MiB in use" in text  # the GPU's memory in use: 8192 + 512
        approve = next(v for k, v in buttons(request) if k == ACTION_APPROVE)
        assert [k for k, _ in buttons(request)] == [ACTION_APPROVE, ACTION_DENY]
        assert hoarder.alive()  # nothing is killed before an approver decides
        await h.send.click(
            ACTION_APPROVE,
            approve,
            user="U0DAVE",
            channel="C0ONCALL",
            message_ts=str(request.answer["ts"]),
        )
        await h.settle()
        assert not hoarder.alive()
        assert small.alive() and kept.alive() and busy.alive()  # only that process
        (action,) = await h.store.actions()
        assert (action.actor, action.status) == ("U0DAVE", "freed")
        assert action.command.startswith(f"/gpu reset node1 gpu 0 pid {hoarder.pid} (Free it, ")
        assert "reclaim ladder: held idle 2.50 GPU-hours" in action.command

        # a holder no longer idle leaves the ladder
        await sweep_at(165)

        # the owner's Home tab shows their own GPU-hours of the week
        await h.send.event({"type": "app_home_opened", "user": "U0OWNER", "tab": "home"})
        await h.settle()
        view = fake.ok("views.publish")[-1].body["view"]
        view = json.loads(view) if isinstance(view, str) else view
        home = json.dumps(view["blocks"], ensure_ascii=False)
        # 12 sweeps of 15 min: GPU 1 busy throughout (3 h); GPUs 0 and 2 at 0 % (3 h each)
        assert "Your GPU-hours, last 7 days: 3.0 busy · 6.0 idle · 0.0 claimed unused" in home

        # /gpu report by node as a signed slash command
        await h.send.command("report 1d by node", user="U0BOB")
        await h.settle()
        answer = json.dumps([c.body for c in fake.responses()][-1], ensure_ascii=False)
        assert "GPU-hours by node" in answer and "node1" in answer and "sweep(s) in" in answer

    steps = ladder_records(db_url)
    assert [(w, actor) for w, k, actor in steps if k == b] == [
        ("dm", "gpubot"),
        ("kept", "slack:U0OWNER"),
    ]
    assert [(w, actor) for w, k, actor in steps if k == a] == [
        ("dm", "gpubot"),
        ("reminder", "gpubot"),
        ("channel post", "gpubot"),
        ("free it offered", "gpubot"),
        ("free asked", "slack:U0CAROL"),
        ("ended", "gpubot"),
    ]
    kept_rec = next(
        json.loads(r.payload)
        for r in audit_rows(db_url)
        if r.kind == "ladder" and '"kept"' in r.payload
    )
    assert kept_rec["reason"] == "eval run resumes at 18:00" and kept_rec["owner"] == hoarder.user
    assert_within_limits(fake)
