"""The approval outbox on SQLite and PostgreSQL: one post per approval and purpose, a re-ping
only half-way to expiry, and two stores racing for the same re-ping recording it once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gpubot.core.approval.posts import ApprovalPost, Purpose
from gpubot.store import Store, open_store
from tests.fixtures.approvals import REQUEST

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def post(aid: int, purpose: Purpose, at: datetime, token: str) -> ApprovalPost:
    return ApprovalPost(token, aid, purpose, "C0ONCALL", "1.000001", at)


async def test_a_post_is_recorded_once_per_purpose_and_in_its_state(store: Store) -> None:
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, 900, now=T0)
    posts = store.approval_posts
    first = await posts.begin(post(a.id, Purpose.REQUEST, T0, "t1"))
    assert first is not None and first.token == "t1"
    assert await posts.begin(post(a.id, Purpose.REQUEST, T0, "t2")) is None  # once
    assert await posts.begin(post(a.id, Purpose.EXPIRED, T0, "t3")) is None  # not expired
    await posts.finish("t1", "1.000001", T0)
    got = await store.approvals.get(a.id)
    assert got is not None and (got.channel, got.message_ts) == ("C0ONCALL", "1.000001")
    assert await posts.pending(T0 + timedelta(hours=1)) == []
    early = T0 + timedelta(seconds=449)  # the control: before half of 900 s
    assert await posts.begin(post(a.id, Purpose.REPING, early, "t4")) is None
    half = T0 + timedelta(seconds=450)
    assert await posts.begin(post(a.id, Purpose.REPING, half, "t5"), audit={"post": "reping"})
    assert await posts.begin(post(a.id, Purpose.REPING, half, "t6")) is None
    assert await posts.purposes(a.id) == {Purpose.REQUEST, Purpose.REPING}
    (pending,) = await posts.pending(half + timedelta(seconds=1))
    assert pending.token == "t5" and pending.thread_ts == "1.000001"
    await posts.abandon("t5", "history unreadable", half)
    records = [r.data for r in await store.records() if r.kind == "approval"]
    assert [r.get("post") for r in records] == [None, "reping", "reping"]
    assert records[-1]["not posted"] == "history unreadable"
    assert (await store.verify()).ok


async def test_two_stores_record_one_re_ping(fresh_db_url: str) -> None:
    one, two = open_store(fresh_db_url), open_store(fresh_db_url)
    try:
        a = await one.approvals.create("U1", "alice", "node3", REQUEST, 900, now=T0)
        half = T0 + timedelta(seconds=451)
        got = await asyncio.gather(
            *(
                s.approval_posts.begin(post(a.id, Purpose.REPING, half, f"r{i}"))
                for i, s in enumerate((one, two, one, two))
            )
        )
        assert len([g for g in got if g is not None]) == 1
    finally:
        one.close()
        two.close()
