"""Direct messages posted once, through the one outbox.

The idle holder's DM, from the notifier ``gpubot.app`` builds (its real Web API client, giving
up after ``QUICK_TIMEOUT_S``; the store's outbox), against the loopback fake Web API, which
keeps a message before it answers: a DM whose answer comes after the client's timeout (at
``LATE_S``) is found in the DM's history and adopted, one message. The control takes the
history search out: the same DM twice. A DM whose end is unknown and whose history cannot be
read is posted once more, saying so. The claims' free-GPU hold DM, through signed Slack
requests to the bot as ``gpubot serve`` wires it: the same, once, and twice in the control.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.app import build
from gpubot.config import Settings
from gpubot.core.alerting import Delivery, Lookup
from gpubot.services.outbox import ALERT
from gpubot.slack import poster as poster_mod
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.poster import EVENT
from gpubot.store import Store
from gpubot.store.tables import outbox
from tests.fixtures.settings import ManualClock, with_tables
from tests.fixtures.slack import (
    LATE_S,
    QUICK_TIMEOUT_S,
    DmSlack,
    FakeSlack,
    assert_within_limits,
    slack_front,
)
from tests.fixtures.slack_flows import ask, idle_group, serving

CHANNEL = "C0ALERTS"
DM = "D0ALICE"  # the fake's DM channel of U0ALICE
EXTRA: dict[str, Any] = {
    "slack": {"channel": "C0GENERAL"},
    "alerts": {"channel": CHANNEL},
    "users": {"U0ALICE": "alice"},
}
SUBJECT = "dm:idle:node7:3:4242:99:U0ALICE"


@asynccontextmanager
async def notifier(fake: FakeSlack, tmp_path: Path) -> AsyncIterator[tuple[SlackAlerts, Store]]:
    """The sweep's Slack notifier as the app builds it, with its store."""
    settings = with_tables(Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}"), EXTRA)
    front = slack_front(fake, timeout=QUICK_TIMEOUT_S)
    app = build(settings, {}, need_store=True, front=front)
    assert app.store is not None and app.sweep.keeper is not None
    alerts = app.sweep.keeper.notifier
    assert isinstance(alerts, SlackAlerts)
    try:
        yield alerts, app.store
    finally:
        await app.close()


def in_channel(fake: FakeSlack, channel: str) -> list[tuple[str, dict[str, Any]]]:
    """The messages in ``channel`` now, oldest first: what people see."""
    found = [(ts, m) for (c, ts), m in fake.messages.items() if c == channel]
    return sorted(found, key=lambda p: float(p[0]))


def posts(store: Store) -> list[tuple[str, str, str, str | None, int]]:
    """(token, subject, state, message_ts, repeats) of every outbox row, oldest first."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox).order_by(outbox.c.id)).all()
    return [(r.token, r.subject, r.state, ts_of(r.ref), r.repeats) for r in rows]


def ts_of(ref: str | None) -> str | None:
    """The message ts of a Slack message reference ("CHANNEL/TS")."""
    return None if ref is None else ref.partition("/")[2]


def token_of(message: dict[str, Any]) -> str:
    meta = message["metadata"]
    assert meta["event_type"] == EVENT
    return str(meta["event_payload"]["token"])


def posts_to(fake: FakeSlack, channel: str) -> list[Any]:
    return [c for c in fake.of("chat.postMessage") if c.body.get("channel") == channel]


async def test_an_idle_holders_dm_answered_after_the_timeout_appears_once(
    dm_slack: DmSlack, tmp_path: Path
) -> None:
    async with notifier(dm_slack, tmp_path) as (alerts, store):
        dm_slack.channel_delays[("chat.postMessage", DM)] = LATE_S  # the alert is answered
        t0 = time.monotonic()
        posted = await alerts.post(idle_group("alice"), token="t1")
        assert posted.delivery is Delivery.POSTED and posted.ref is not None
        assert time.monotonic() - t0 >= QUICK_TIMEOUT_S  # the DM's answer was lost to it
        (post,) = posts_to(dm_slack, DM)  # no second post of a lost answer
        (history,) = dm_slack.of("conversations.history")
        assert history.body["channel"] == DM
        assert history.body["include_all_metadata"] in ("1", "true")
        [(ts, message)] = in_channel(dm_slack, DM)  # what alice sees: one DM
        assert "Your job holds node7 GPU 3 idle" in str(message["text"])
        assert posts(store) == [(token_of(message), SUBJECT, "posted", ts, 0)]  # adopted
        assert await store.outbox.pending(SUBJECT) == []
        assert await store.outbox.pending(ALERT, under=True) == []  # no alert post among them
        await dm_slack.wait_for(lambda: post.answered_at is not None, 30)
        assert (post.answered_at or 0.0) - post.at >= LATE_S - 0.5  # Slack answered late
    assert_within_limits(dm_slack)


async def test_control_without_the_history_search_the_idle_dm_appears_twice(
    dm_slack: DmSlack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing_there(*args: Any, **kwargs: Any) -> Lookup:
        return Lookup(True)  # "provably absent": what a post-again-on-timeout rule assumes

    monkeypatch.setattr(poster_mod, "find_post", nothing_there)
    async with notifier(dm_slack, tmp_path) as (alerts, _):
        dm_slack.channel_delays[("chat.postMessage", DM)] = LATE_S
        await alerts.post(idle_group("alice"), token="t1")
    first, again = in_channel(dm_slack, DM)  # the same DM, twice
    assert first[1]["text"] == again[1]["text"]


async def test_an_uncertain_dm_with_no_history_is_posted_once_more_saying_so(
    dm_slack: DmSlack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 5xx: Slack may have it. Its history readable and without it: posted again under the
    same token, one DM. Unreadable (no im:history): once more, saying it may repeat."""
    async with notifier(dm_slack, tmp_path) as (alerts, store):
        dm_slack.fail("chat.postMessage", "internal_error", status=500, channel=DM)
        await alerts.direct(idle_group("alice"), None)
        assert len(posts_to(dm_slack, DM)) == 2
        [(ts, message)] = in_channel(dm_slack, DM)
        assert "may repeat" not in json.dumps(message)
        assert posts(store) == [(token_of(message), SUBJECT, "posted", ts, 0)]

        dm_slack.history_readable = False
        dm_slack.fail("chat.postMessage", "internal_error", status=500, channel=DM)
        with caplog.at_level(logging.WARNING):
            assert await alerts.direct(idle_group("alice"), None) == 1
        assert len(posts_to(dm_slack, DM)) == 4  # not one more: it is said once
        assert any("add im:history" in r.getMessage() for r in caplog.records)
        [_, (ts2, repeat)] = in_channel(dm_slack, DM)
        assert "this may repeat the message of <!date^" in json.dumps(repeat)
        assert posts(store)[1][2:] == ("posted", ts2, 1)


async def hold_dm_to_dave(slack_settings: Any, fake: DmSlack, tmp_path: Path) -> list[Any]:
    """Bob claims node1 GPU 3, Dave queues for it, Bob releases it: Dave's hold DM is posted
    (answered after the timeout); return the messages in Dave's DM."""
    clock = ManualClock()
    db = f"sqlite:///{tmp_path}/c.db"
    async with serving(slack_settings, fake, db, clock, timeout=QUICK_TIMEOUT_S) as (h, _):
        assert "CUDA_VISIBLE_DEVICES" in await ask(h, "claim node1 gpu 3 for 4h", "U0BOB")
        assert "in line for node1 GPU 3" in await ask(h, "wait node1 gpu 3", "U0DAVE")
        fake.channel_delays[("chat.postMessage", "D0DAVE")] = LATE_S
        assert "released: node1 GPU 3" in await ask(h, "release node1 gpu 3", "U0BOB")
        await h.settle()
        sent = posts_to(fake, "D0DAVE")
        await fake.wait_for(lambda: all(c.answered_at is not None for c in sent), 30)
        return [m for _, m in in_channel(fake, "D0DAVE")]


async def test_the_free_gpu_hold_dm_answered_after_the_timeout_appears_once(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Path, node1: Any
) -> None:
    [offer] = await hold_dm_to_dave(slack_settings, dm_slack, tmp_path)
    assert "is free and held for you" in json.dumps(offer)
    assert offer["metadata"]["event_type"] == EVENT
    assert [c.body["channel"] for c in dm_slack.of("conversations.history")] == ["D0DAVE"]


async def test_control_without_the_history_search_the_hold_dm_appears_twice(
    slack_settings: Any,
    dm_slack: DmSlack,
    tmp_path: Path,
    node1: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nothing_there(*args: Any, **kwargs: Any) -> Lookup:
        return Lookup(True)

    monkeypatch.setattr(poster_mod, "find_post", nothing_there)
    first, again = await hold_dm_to_dave(slack_settings, dm_slack, tmp_path)  # twice
    assert first["text"] == again["text"]
