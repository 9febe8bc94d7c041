"""Alerts posted once: a Web API that answers after 12 s, a bot SIGKILLed with a post in flight,
and a channel whose history gpubot cannot read. Each has its control: the order before the
outbox (post, then record), or the history search taken out, posts the alert twice.

The 12 s answer meets the product's client (its 10 s timeout); the controls and the unreadable
history, a client that gives up after ``QUICK_TIMEOUT_S`` and an answer after ``LATE_S``.

The fake Web API (``benchmarks/fake_slack.py``) keeps a posted message before it answers, as a
Slack that took the post but whose answer is late; its ``conversations.history`` pages and
returns metadata as Slack documents (``benchmarks/fake_history.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.core.alerting import Delivery, Lookup
from gpubot.core.findings import FindingKey
from gpubot.services.outbox import ALERT
from gpubot.services.sweep import SweepService
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.poster import EVENT, post_once
from gpubot.store import Store
from gpusim.fleet import SimFleet
from tests.fixtures.settings import sweep_ports
from tests.fixtures.slack import (
    BOT_TOKEN,
    LATE_S,
    QUICK_TIMEOUT_S,
    FakeSlack,
    assert_within_limits,
    slack_api,
)
from tests.integration.outbox_main import CHANNEL, outbox_settings, post_then_record
from tests.procs import wait_dead

REPO = Path(__file__).resolve().parents[2]
SLOW_S = 12.0  # past the Web API client's 10 s timeout


def channel_messages(fake: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    """Return the messages in the alert channel, oldest first: what people see."""
    found = [(ts, m) for (c, ts), m in fake.messages.items() if c == CHANNEL]
    return sorted(found, key=lambda p: float(p[0]))


def text_of(message: dict[str, Any]) -> str:
    blocks = message.get("blocks") or []
    return json.dumps(json.loads(blocks) if isinstance(blocks, str) else blocks) + str(
        message.get("text")
    )


@pytest.fixture
def orphan(slack_fleet: SimFleet) -> Iterator[str]:
    """Leaked VRAM on node1 GPU 3 (its process killed); the finding key's text."""
    n1 = slack_fleet.node("node1")
    w = n1.spawn(gpu=3, mib=4096, behaviour="orphan")
    os.kill(w.pid, signal.SIGKILL)
    wait_dead(w.pid)
    try:
        yield FindingKey("node1", 3, "orphaned-vram").text()
    finally:
        n1.clear()


@asynccontextmanager
async def sweeper(
    fleet: SimFleet,
    fake: FakeSlack,
    db_url: str,
    *,
    order: str = "outbox",
    timeout: int | None = None,
) -> AsyncIterator[tuple[SweepService, Store]]:
    """The real composition with a sweep service posting to ``fake`` (or the control's), its
    Web API client giving up after ``timeout`` seconds (None: the product's 10 s)."""
    settings = outbox_settings(fleet.config_path, db_url)
    app = build(settings, {}, need_store=True)
    assert app.store is not None
    if order == "outbox":
        notifier = SlackAlerts(slack_api(fake.base_url, timeout=timeout), CHANNEL)
        ports = sweep_ports(settings, app.store, notifier=notifier)
        svc = SweepService(settings, app.status, app.transport, ports, replica="test")
    else:
        svc = post_then_record(settings, app, fake.base_url, timeout=timeout)
    try:
        yield svc, app.store
    finally:
        await app.close()


async def test_a_web_api_answering_after_12_s_posts_the_alert_once(
    slack_fleet: SimFleet, fake_slack: FakeSlack, orphan: str, tmp_path: Path
) -> None:
    async with sweeper(slack_fleet, fake_slack, f"sqlite:///{tmp_path}/a.db") as (svc, store):
        assert (await svc.run()).alerted == ()  # seen once: not confirmed yet
        fake_slack.delays["chat.postMessage"] = SLOW_S
        t0 = time.monotonic()
        second = await svc.run()
        took = time.monotonic() - t0
        (post,) = fake_slack.of("chat.postMessage")  # one call: no retry of a lost answer
        assert took >= 10.0  # the client's timeout came first
        assert [k.text() for k in second.alerted] == [orphan]  # found in the history, adopted
        (history,) = fake_slack.of("conversations.history")
        assert history.body["include_all_metadata"] in ("1", "true")
        fake_slack.delays.clear()
        assert (await svc.run()).alerted == ()
        await fake_slack.wait_for(lambda: post.answered_at is not None, 30)
        assert (post.answered_at or 0.0) - post.at >= SLOW_S - 0.5  # Slack answered after 12 s
        [(ts, message)] = channel_messages(fake_slack)
        meta = message["metadata"]
        assert meta["event_type"] == EVENT and len(meta["event_payload"]["token"]) == 32
        (alert,) = await store.alerts.open_alerts()
        assert alert.ref == f"{CHANNEL}/{ts}"
        (record,) = [r.data for r in await store.records() if r.kind == "alert"]
        assert (record["alert"], record["adopted"], record["ref"]) == ("alerted", True, alert.ref)
        # the adopted message is the alert's: it is the one updated when the finding clears
        slack_fleet.node("node1").clear()
        assert (await svc.run()).resolved == ()  # cleared for one sweep: held (hysteresis)
        cleared = await svc.run()
        assert [k.text() for k in cleared.resolved] == [orphan]
        (update,) = fake_slack.ok("chat.update")
        assert (update.body["channel"], update.body["ts"]) == (CHANNEL, ts)
        [(_, message)] = channel_messages(fake_slack)
        assert "resolved" in text_of(message) and message["metadata"] == meta
    assert_within_limits(fake_slack)


@pytest.mark.parametrize("control", ["post-then-record", "no-history-search"])
async def test_control_a_slow_answer_posts_twice_without_the_outbox(
    slack_fleet: SimFleet,
    fake_slack: FakeSlack,
    orphan: str,
    tmp_path: Path,
    control: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if control == "no-history-search":  # the intent stays; the search never finds the post

        async def nothing_there(self: SlackAlerts, token: str, since: Any) -> Lookup:
            return Lookup(True)

        monkeypatch.setattr(SlackAlerts, "find", nothing_there)
    order = "post-first" if control == "post-then-record" else "outbox"
    db = f"sqlite:///{tmp_path}/c.db"
    async with sweeper(slack_fleet, fake_slack, db, order=order, timeout=QUICK_TIMEOUT_S) as (
        svc,
        _,
    ):
        await svc.run()
        fake_slack.delays["chat.postMessage"] = LATE_S
        t0 = time.monotonic()
        await svc.run()  # the answer is lost
        assert time.monotonic() - t0 >= QUICK_TIMEOUT_S  # the client's timeout came first
        fake_slack.delays.clear()
        await svc.run()  # and the alert goes out again
        await svc.run()
    assert len(channel_messages(fake_slack)) == 2  # the same alert, twice


async def test_unreadable_history_posts_once_saying_it_may_repeat(
    slack_fleet: SimFleet, fake_slack: FakeSlack, orphan: str, tmp_path: Path
) -> None:
    fake_slack.history_readable = False  # no channels:history scope: missing_scope
    db = f"sqlite:///{tmp_path}/h.db"
    async with sweeper(slack_fleet, fake_slack, db, timeout=QUICK_TIMEOUT_S) as (svc, store):
        await svc.run()
        fake_slack.delays["chat.postMessage"] = LATE_S
        t0 = time.monotonic()
        assert (await svc.run()).alerted == ()  # uncertain, and nothing can tell: pending
        assert time.monotonic() - t0 >= QUICK_TIMEOUT_S  # the client's timeout came first
        [pending] = await store.outbox.pending(ALERT, under=True)
        fake_slack.delays.clear()
        third = await svc.run()
        assert [k.text() for k in third.alerted] == [orphan]
        assert (await svc.run()).alerted == ()
        assert await store.outbox.pending(ALERT, under=True) == []
    first, again = channel_messages(fake_slack)  # Slack had the first: two, and no third
    assert "may repeat" not in text_of(first[1])
    hhmm = pending.created_at.strftime("%H:%M UTC")
    assert "this may repeat the alert of <!date^" in text_of(again[1])
    assert f"|{hhmm}>" in text_of(again[1])
    assert again[1]["metadata"]["event_payload"]["token"] == pending.token
    assert all(
        c.answer.get("error") == "missing_scope" for c in fake_slack.of("conversations.history")
    )
    assert_within_limits(fake_slack)


async def run_sweeps(
    config: Path, db_url: str, fake: FakeSlack, order: str, sweeps: int
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.outbox_main",
        str(config),
        db_url,
        fake.base_url,
        order,
        str(sweeps),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.parametrize("order", ["outbox", "post-first"])
async def test_sigkill_with_an_alert_post_in_flight(
    slack_fleet: SimFleet, fake_slack: FakeSlack, orphan: str, tmp_path: Path, order: str
) -> None:
    """The bot is SIGKILLed once Slack has the message and before it answered; restarted, it
    posts no second message (the control, posting first and recording after, does)."""
    db = f"sqlite:///{tmp_path}/k.db"
    fake_slack.delays["chat.postMessage"] = 120.0  # answered long after the kill
    proc = await run_sweeps(slack_fleet.config_path, db, fake_slack, order, 2)
    try:
        await fake_slack.wait_for(lambda: bool(fake_slack.of("chat.postMessage")), 90)
    finally:
        proc.kill()  # the process this test started, by pid
        await proc.wait()
    assert len(channel_messages(fake_slack)) == 1  # Slack has it; nobody heard back
    fake_slack.delays.clear()
    again = await run_sweeps(slack_fleet.config_path, db, fake_slack, order, 2)
    out, err = await asyncio.wait_for(again.communicate(), 120)
    assert again.returncode == 0, err.decode()[-2000:]
    lines = [json.loads(line) for line in out.decode().splitlines()]
    messages = channel_messages(fake_slack)
    if order == "post-first":  # the control: the same alert a second time
        assert len(messages) == 2
        return
    assert [line["alerted"] for line in lines] == [[orphan], []]  # adopted at the first sweep
    [(ts, _)] = messages
    from gpubot.store import open_store

    store = open_store(db)
    try:
        (alert,) = await store.alerts.open_alerts()
        assert alert.ref == f"{CHANNEL}/{ts}"
        assert [r.data.get("adopted") for r in await store.records() if r.kind == "alert"] == [True]
    finally:
        store.close()
    (history,) = fake_slack.of("conversations.history")
    assert float(history.body["oldest"]) <= float(ts)


async def test_a_late_answer_never_raises_out_of_the_web_api_wrapper(
    fake_slack: FakeSlack,
) -> None:
    """``SlackApi`` answers None on a timeout, and a ``chat.update`` whose answer is late posts
    no second message; the control: the client under it raises ``TimeoutError``."""
    api = SlackApi(make_client(BOT_TOKEN, fake_slack.base_url, timeout=1))
    where = await api.post("C0X", {"text": "first"})
    assert where is not None
    fake_slack.delays.update({"chat.postMessage": 3.0, "chat.update": 3.0})
    assert await api.post("C0X", {"text": "late"}) is None
    assert await api.update(where, {"text": "edited"}) == where  # it may have applied
    assert len(fake_slack.of("chat.postMessage")) == 2  # no post "anew" after a late update
    with pytest.raises(TimeoutError):
        await api.client.chat_postMessage(channel="C0X", text="raw")


async def test_a_5xx_answer_is_uncertain_and_never_followed_by_another_post(
    fake_slack: FakeSlack,
) -> None:
    """After HTTP 500 Slack may have the post: ``post_once`` sends nothing more (no retry, no
    simpler form); a refusal of the blocks at HTTP 200 steps down as usual. ``SlackApi.post``
    neither (issue 34); its control, slack_sdk's stock 5xx retry, is in ``test_posted_once``."""
    api = SlackApi(make_client(BOT_TOKEN, fake_slack.base_url))
    msg = {"text": "x", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "x"}}]}
    fake_slack.fail("chat.postMessage", "internal_error", status=500)
    posted = await post_once(api, CHANNEL, msg, token="t1")
    assert (posted.delivery, posted.why) == (Delivery.UNCERTAIN, "HTTP 500 internal_error")
    assert len(fake_slack.of("chat.postMessage")) == 1
    fake_slack.fail("chat.postMessage", "invalid_blocks")
    posted = await post_once(api, CHANNEL, msg, token="t2")
    assert posted.delivery is Delivery.POSTED
    assert fake_slack.of("chat.postMessage")[-1].body["blocks"] == []  # as text, the token kept
    assert fake_slack.of("chat.postMessage")[-1].body["metadata"]["event_payload"] == {
        "token": "t2"
    }
    fake_slack.calls.clear()
    fake_slack.fail("chat.postMessage", "internal_error", status=500)
    assert await api.post(CHANNEL, msg) is None  # it may be there: nothing more is sent
    assert len(fake_slack.of("chat.postMessage")) == 1
