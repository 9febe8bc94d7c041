"""The bot posts the audit chain's head to the alerts channel on its schedule (the real
scheduler, the real Slack client, the fake Web API), and a later publication notices when the
log no longer holds the head posted before."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gpubot.app import App, Serving, build
from gpubot.chat.heads import HeadPublisher
from gpubot.config import AuditSettings, Settings
from gpubot.store import Store
from tests.fixtures.db import audit_rows, rewrite_chain
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import FakeSlack, assert_within_limits, slack_front

EXTRA: dict[str, Any] = {"slack": {"channel": "C0GENERAL"}, "alerts": {"channel": "C0ALERTS"}}


@asynccontextmanager
async def publishing(
    fake: FakeSlack, tmp_path: Path, tables: dict[str, Any] = EXTRA, **changes: Any
) -> AsyncIterator[tuple[Store, App]]:
    """What ``gpubot serve`` wires: the app with its schedules, among them the head's."""
    settings = dataclasses.replace(
        with_tables(Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}"), tables), **changes
    )
    app = build(
        settings,
        {},
        need_store=True,
        front=slack_front(fake),
        serving=Serving(sweeps=False, settle_heap=False, first_after_s=0),
    )
    assert app.store is not None
    await app.store.record_query(
        kind="status", actor="U0BOB", source="slack", nodes=["n1"], failed={}, seconds=0.1
    )
    app.start()
    try:
        yield app.store, app
    finally:
        await app.close()


def posted(fake: FakeSlack) -> list[tuple[str, str, str]]:
    """(channel, text, blocks as JSON text) of every message posted."""
    out = []
    for c in fake.ok("chat.postMessage"):
        blocks = c.body["blocks"]
        blocks = blocks if isinstance(blocks, str) else json.dumps(blocks, ensure_ascii=False)
        out.append((str(c.body["channel"]), str(c.body["text"]), blocks))
    return out


async def test_the_head_is_posted_to_the_alerts_channel(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    async with publishing(fake_slack, tmp_path) as (store, app):
        heads = app.heads
        assert isinstance(heads, HeadPublisher)
        schedule = app.scheduler("audit-head")
        assert schedule is not None
        assert schedule.interval_s == 86400.0  # [audit] publish_head_every = "24h"
        await fake_slack.wait_for(lambda: bool(fake_slack.ok("chat.postMessage")))
        result = await store.verify()
        [(channel, text, blocks)] = posted(fake_slack)
        assert channel == "C0ALERTS"
        [record] = audit_rows(f"sqlite:///{tmp_path / 'audit.db'}")
        assert result.head == f"1:{record.hash}"
        assert text == f"Audit log head {result.head}"
        assert f"gpubot audit verify --expect-head {result.head}" in blocks
        assert "1 records, plain (sha256, no key)" in blocks
        assert heads.last == (result.head_seq, result.head_hash)
        assert (await store.verify(published=heads.last)).ok
    assert_within_limits(fake_slack)


async def test_a_rewrite_after_a_publication_is_posted(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    async with publishing(fake_slack, tmp_path) as (store, app):
        heads = app.heads
        assert isinstance(heads, HeadPublisher)
        await fake_slack.wait_for(lambda: bool(fake_slack.ok("chat.postMessage")))
        first = heads.last
        await store.record_query(
            kind="status", actor="U0BOB", source="slack", nodes=["n2"], failed={}, seconds=0.1
        )
        rewrite_chain(url, 1, '{"query":"nothing"}')  # consistent again, but not the same log
        result = await heads.publish()
        assert result is not None and not result.ok
        [_, (channel, text, blocks)] = posted(fake_slack)
        assert channel == "C0ALERTS"
        assert first is not None
        assert text.startswith(
            f"⚠ The audit log does not verify: audit log tampered: the published head {first[0]}:"
        )
        assert "Audit log check failed" in blocks and "(the log was rewritten)" in blocks
        assert heads.last == first  # the anchor stays the last good head
    assert_within_limits(fake_slack)


async def test_no_publication_when_off(fake_slack: FakeSlack, tmp_path: Path) -> None:
    async with publishing(fake_slack, tmp_path, audit=AuditSettings(None)) as (_, app):
        assert app.heads is None and app.scheduler("audit-head") is None
    (tmp_path / "other").mkdir()
    async with publishing(fake_slack, tmp_path / "other", tables={}) as (_, app):
        assert app.heads is None  # no channel to post to
    assert fake_slack.of("chat.postMessage") == []
