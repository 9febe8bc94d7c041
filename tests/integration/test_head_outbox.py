"""The audit head's publications are posted once, through the one outbox.

The app as ``gpubot serve`` builds it (its ``HeadPublisher``, the real Slack client, giving up
after ``QUICK_TIMEOUT_S``) against the loopback fake Web API, which keeps a message before it
answers. A publication whose answer comes after the client's timeout (at ``LATE_S``) is found
in the channel's history and adopted: one head message. The control takes the history search
out: the same head, twice.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from gpubot.app import Serving, build
from gpubot.chat.heads import SUBJECT, HeadPublisher, render_head
from gpubot.config import Settings
from gpubot.core.alerting import Intent, Lookup
from gpubot.services.outbox import ALERT
from gpubot.slack import poster as poster_mod
from gpubot.slack.poster import EVENT, SlackPoster, post_once
from gpubot.slack.render import to_slack
from gpubot.store import Store
from gpubot.store.tables import outbox
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import (
    LATE_S,
    QUICK_TIMEOUT_S,
    FakeSlack,
    assert_within_limits,
    slack_front,
)

CHANNEL = "C0ALERTS"
EXTRA: dict[str, Any] = {"slack": {"channel": "C0GENERAL"}, "alerts": {"channel": CHANNEL}}


@asynccontextmanager
async def publisher(fake: FakeSlack, tmp_path: Path) -> AsyncIterator[tuple[HeadPublisher, Store]]:
    """The app's head publisher (its schedule not started: the test publishes)."""
    settings = with_tables(Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}"), EXTRA)
    app = build(
        settings,
        {},
        need_store=True,
        front=slack_front(fake, timeout=QUICK_TIMEOUT_S),
        serving=Serving(settle_heap=False, first_after_s=3600),
    )
    assert app.store is not None and isinstance(app.heads, HeadPublisher)
    await app.store.record_query(
        kind="status", actor="U0BOB", source="slack", nodes=["n1"], failed={}, seconds=0.1
    )
    try:
        yield app.heads, app.store
    finally:
        await app.close()


def heads_posted(fake: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    """The messages in the alerts channel, oldest first: what people see."""
    found = [(ts, m) for (c, ts), m in fake.messages.items() if c == CHANNEL]
    return sorted(found, key=lambda p: float(p[0]))


def token_of(message: dict[str, Any]) -> str:
    meta = message["metadata"]
    assert meta["event_type"] == EVENT
    return str(meta["event_payload"]["token"])


def posts(store: Store) -> list[tuple[str, str, str, str | None]]:
    """(token, subject, state, message_ts) of every outbox row, oldest first."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox).order_by(outbox.c.id)).all()
    return [(r.token, r.subject, r.state, r.ref and r.ref.partition("/")[2]) for r in rows]


async def test_a_web_api_answering_after_the_timeout_posts_the_head_once(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    async with publisher(fake_slack, tmp_path) as (heads, store):
        fake_slack.delays["chat.postMessage"] = LATE_S
        t0 = time.monotonic()
        result = await heads.publish()
        assert result is not None and result.ok
        assert time.monotonic() - t0 >= QUICK_TIMEOUT_S  # the client's timeout came first
        (post,) = fake_slack.of("chat.postMessage")  # no second post of a lost answer
        (history,) = fake_slack.of("conversations.history")
        assert history.body["include_all_metadata"] in ("1", "true")
        [(ts, message)] = heads_posted(fake_slack)
        assert str(message["text"]) == f"Audit log head {result.head}"
        token = token_of(message)
        assert posts(store) == [(token, SUBJECT, "posted", ts)]  # adopted from the history
        assert await store.outbox.pending(SUBJECT) == []
        assert await store.outbox.pending(ALERT, under=True) == []  # no alert post among them
        fake_slack.delays.clear()
        await heads.publish()  # the next publication: its own message, once
        [_, (_, later)] = heads_posted(fake_slack)
        assert token_of(later) != token
        await fake_slack.wait_for(lambda: post.answered_at is not None, 30)
        assert (post.answered_at or 0.0) - post.at >= LATE_S - 0.5  # Slack answered late
    assert_within_limits(fake_slack)


async def test_control_without_the_history_search_the_head_is_posted_twice(
    fake_slack: FakeSlack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing_there(*args: Any, **kwargs: Any) -> Lookup:
        return Lookup(True)  # "provably absent": what a post-again-on-timeout rule assumes

    monkeypatch.setattr(poster_mod, "find_post", nothing_there)
    async with publisher(fake_slack, tmp_path) as (heads, _):
        fake_slack.delays["chat.postMessage"] = LATE_S
        await heads.publish()
    first, again = heads_posted(fake_slack)  # the same head, twice
    assert first[1]["text"] == again[1]["text"]


async def test_a_5xx_not_taken_is_posted_again_with_its_token(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """After HTTP 500 Slack may have it: the history says it does not, so it is posted once
    more under the same token (slack_sdk's own 5xx retry is off for these posts)."""
    fake_slack.fail("chat.postMessage", "internal_error", status=500)
    async with publisher(fake_slack, tmp_path) as (heads, store):
        await heads.publish()
        assert len(fake_slack.of("chat.postMessage")) == 2
        [(ts, message)] = heads_posted(fake_slack)
        assert posts(store) == [(token_of(message), SUBJECT, "posted", ts)]


async def test_the_next_publication_settles_the_ones_left_unconfirmed(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """A publication killed after Slack took it is adopted; one nobody can check (no history
    scope) is given up with an audit record, and the next head says it may repeat it."""
    async with publisher(fake_slack, tmp_path) as (heads, store):
        earlier = datetime.now(UTC)
        crashed = await store.outbox.begin(Intent(SUBJECT, earlier, token="a" * 32))
        assert crashed is not None
        msg = to_slack(render_head(await store.verify(), earlier))
        api = cast(SlackPoster, heads.outbox.poster).api
        landed = await post_once(api, CHANNEL, msg, token=crashed.token)
        assert landed.ref is not None  # Slack has it; the bot was killed before marking it
        await heads.publish()
        assert posts(store)[0] == (crashed.token, SUBJECT, "posted", landed.ref.partition("/")[2])
        assert len(heads_posted(fake_slack)) == 2  # the crashed one (adopted) and the new one

        fake_slack.history_readable = False
        fake_slack.delays["chat.postMessage"] = LATE_S
        await heads.publish()  # uncertain, and the history cannot tell: left pending
        [unsure] = await store.outbox.pending(SUBJECT)
        fake_slack.delays.clear()
        await heads.publish()
        assert await store.outbox.pending(SUBJECT) == []
        *_, (_, last) = heads_posted(fake_slack)
        assert "this may repeat the head posted at <!date^" in str(last["blocks"])
        hhmm = unsure.created_at.strftime("%H:%M UTC")
        assert f"|{hhmm}>" in str(last["blocks"])
        (gave_up,) = [r for r in await store.records() if r.kind == "alert"]
        assert gave_up.node is None and gave_up.data["message"] == SUBJECT
        assert gave_up.data["token"] == unsure.token and "missing_scope" in gave_up.data["why"]
        assert (await store.verify()).ok
