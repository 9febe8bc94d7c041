"""The alert outbox on SQLite and PostgreSQL: the intent to post is recorded with the findings'
state change, in one transaction, and settles once (posted, adopted, refused, abandoned)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gpubot.core.alerting import Delivery, Lookup, Notice, Posted, notice
from gpubot.core.findings import FindingKey, SweepConfig
from gpubot.errors import StoreError
from gpubot.services.alert_outbox import AlertOutbox, once_token
from gpubot.store import Store, open_store
from gpubot.store.tables import alert_posts

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ORPHAN = FindingKey("node3", 2, "orphaned-vram")
ZOMBIE = FindingKey("node3", 0, "zombie-process", "pid:4242:991")


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def _confirmed(store: Store) -> None:
    await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(0))
    await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(5))


async def test_the_intent_marks_the_findings_alerted_before_the_post(store: Store) -> None:
    await _confirmed(store)
    pending = await store.alerts.begin_post("tok1", "node3", [ORPHAN, ZOMBIE], _at(5))
    assert pending is not None
    assert (pending.token, pending.node, pending.keys) == ("tok1", "node3", (ORPHAN, ZOMBIE))
    assert (pending.since, pending.created_at, pending.repeats) == (_at(0), _at(5), 0)
    assert await store.alerts.pending_posts() == [pending]
    # a sweep after a crash here alerts nothing anew: the state says "alerted", no message yet
    for a in await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(10)):
        assert (a.alerted_at, a.handle) == (_at(5), None)
        assert notice(a.key.kind, a, _at(10), SweepConfig()) is Notice.NONE
    # nor does a second intent for the same findings (another replica, a retry)
    assert await store.alerts.begin_post("tok2", "node3", [ORPHAN], _at(10)) is None

    assert await store.alerts.finish_post("tok1", "C1", "1.5", _at(11), taken=_at(5)) == [
        ORPHAN,
        ZOMBIE,
    ]
    assert await store.alerts.pending_posts() == []
    assert {a.handle for a in await store.alerts.open_alerts()} == {("C1", "1.5")}
    trail = [r.data for r in await store.records() if r.kind == "alert"]
    assert [(d["alert"], d["key"], d["token"]) for d in trail] == [
        ("alerted", ORPHAN.text(), "tok1"),
        ("alerted", ZOMBIE.text(), "tok1"),
    ]
    assert (await store.verify()).ok


async def test_a_refused_post_leaves_the_findings_to_alert_again(store: Store) -> None:
    await _confirmed(store)
    assert await store.alerts.begin_post("tok1", "node3", [ORPHAN], _at(5)) is not None
    await store.alerts.cancel_post("tok1", _at(6), taken=_at(5))
    assert await store.alerts.pending_posts() == []
    orphan = next(a for a in await store.alerts.open_alerts() if a.key == ORPHAN)
    assert orphan.alerted_at is None
    assert notice(ORPHAN.kind, orphan, _at(6), SweepConfig()) is Notice.ALERT
    assert await store.alerts.begin_post("tok2", "node3", [ORPHAN], _at(10)) is not None


async def test_an_adopted_post_and_an_abandoned_one_are_audited(store: Store) -> None:
    await _confirmed(store)
    await store.alerts.begin_post("tok1", "node3", [ORPHAN], _at(5))
    await store.alerts.begin_post("tok2", "node3", [ZOMBIE], _at(5))
    await store.alerts.note_repeat("tok2")
    [p1, p2] = await store.alerts.pending_posts()
    assert (p1.repeats, p2.repeats) == (0, 1)
    await store.alerts.finish_post("tok1", "C1", "1.7", _at(6), taken=_at(5), adopted=True)
    await store.alerts.abandon_post("tok2", "history unreadable", _at(6), taken=_at(5))
    assert await store.alerts.pending_posts() == []
    trail = [r.data for r in await store.records() if r.kind == "alert"]
    assert trail[0]["adopted"] is True and trail[0]["message_ts"] == "1.7"
    assert trail[1] == {
        "alert": "not posted",
        "keys": [ZOMBIE.text()],
        "token": "tok2",
        "why": "history unreadable",
    }
    with store.engine.connect() as conn:
        states = dict(conn.execute(sa.select(alert_posts.c.token, alert_posts.c.state)).all())
    assert states == {"tok1": "posted", "tok2": "abandoned"}


async def test_a_token_is_recorded_once(store: Store) -> None:
    await _confirmed(store)
    await store.alerts.begin_post("tok1", "node3", [ORPHAN], _at(5))
    with pytest.raises(StoreError):
        await store.alerts.begin_post("tok1", "node3", [ZOMBIE], _at(5))
    with pytest.raises(StoreError, match="no alert post"):
        await store.alerts.finish_post("nope", "C1", "1.1", _at(6), taken=_at(5))
    # the failed intent changed nothing: ZOMBIE is still to alert
    zombie = next(a for a in await store.alerts.open_alerts() if a.key == ZOMBIE)
    assert zombie.alerted_at is None


async def test_a_message_post_is_apart_from_the_alerts(store: Store) -> None:
    """A single message (an audit head) is recorded under its subject with no finding: the
    alerts' reconcile never sees it, its own subject's does, and it settles the same way."""
    await _confirmed(store)
    await store.alerts.begin_post("alert1", "node3", [ORPHAN], _at(5))
    head = await store.alerts.begin_message("head1", "audit-head", _at(6))
    assert (head.token, head.node, head.keys, head.since) == ("head1", "audit-head", (), _at(6))
    assert [p.token for p in await store.alerts.pending_posts()] == ["alert1"]
    assert [p.token for p in await store.alerts.pending_posts("audit-head")] == ["head1"]
    assert await store.alerts.pending_posts("node3") == []  # a node's name is no subject
    assert await store.alerts.finish_post("head1", "C1", "2.2", _at(7), taken=_at(6)) == []
    assert await store.alerts.pending_posts("audit-head") == []
    await store.alerts.begin_message("head2", "audit-head", _at(8))
    await store.alerts.abandon_post("head2", "history unreadable", _at(9), taken=_at(8))
    (rec,) = [r for r in await store.records() if r.kind == "alert"]
    assert rec.node is None and rec.data["message"] == "audit-head" and rec.data["keys"] == []
    assert [p.token for p in await store.alerts.pending_posts()] == ["alert1"]


@pytest.fixture
def replica(fresh_db_url: str, store: Store) -> Iterator[Store]:
    """A second store over the test's database: another replica of gpubot."""
    s = open_store(fresh_db_url)
    try:
        yield s
    finally:
        s.close()


def _row(store: Store, token: str) -> tuple[str, str | None]:
    with store.engine.connect() as conn:
        got = conn.execute(
            sa.select(alert_posts.c.state, alert_posts.c.message_ts).where(
                alert_posts.c.token == token
            )
        ).one()
    return str(got.state), got.message_ts


async def _slow_refused_send_then_replica_posts(
    store: Store, replica: Store, posts: list[str]
) -> None:
    """Replica A's send outlives SETTLE_S; B takes the row over, finds it absent and posts it;
    then A's send ends refused."""
    sending, release = asyncio.Event(), asyncio.Event()

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        sending.set()
        await release.wait()
        return Posted(Delivery.REFUSED, why="ratelimited: Retry-After 120")

    async def send_b(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("B")
        return Posted(Delivery.POSTED, ("D1", "1.1"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, ("D1", "1.1") if posts else None)

    a = AlertOutbox(store.alerts)
    slow = asyncio.create_task(a.publish_once("dm:alice", send_a, find, _at(0)))
    await sending.wait()
    assert await AlertOutbox(replica.alerts).publish_once("dm:alice", send_b, find, _at(2))
    release.set()
    assert not await slow  # A's send was refused; the row is not A's to change any more


async def test_a_lost_take_changes_nothing_and_posted_stays_posted(
    store: Store, replica: Store
) -> None:
    posts: list[str] = []
    await _slow_refused_send_then_replica_posts(store, replica, posts)
    token = once_token("dm:alice")
    assert _row(store, token) == ("posted", "1.1")

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("A")
        return Posted(Delivery.POSTED, ("D1", "1.2"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, ("D1", "1.1"))

    # A's next turn: the row is posted, nothing is posted again
    assert await AlertOutbox(store.alerts).publish_once("dm:alice", send_a, find, _at(3))
    assert posts == ["B"]
    # no change from A's take (T0) lands on it: finish, cancel, abandon, a repeat
    assert await store.alerts.finish_post(token, "D1", "9.9", _at(4), taken=_at(0)) == []
    await store.alerts.cancel_post(token, _at(4), taken=_at(0))
    await store.alerts.abandon_post(token, "history unreadable", _at(4), taken=_at(0))
    await store.alerts.note_repeat(token)
    assert _row(store, token) == ("posted", "1.1")
    assert not [r for r in await store.records() if r.data.get("alert") == "not posted"]


async def test_control_an_unconditional_update_posts_twice(store: Store, replica: Store) -> None:
    """The attack without the defence: the old ``cancel_post`` updated the row by its token
    alone, so A's late "refused" overwrote B's ``posted`` and A's next turn posted again."""
    posts: list[str] = []
    await _slow_refused_send_then_replica_posts(store, replica, posts)
    token = once_token("dm:alice")
    with store.engine.begin() as conn:  # the old cancel_post's statement
        conn.execute(
            alert_posts.update().where(alert_posts.c.token == token).values(state="refused")
        )

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("A")
        return Posted(Delivery.POSTED, ("D1", "1.2"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, None)

    assert await AlertOutbox(store.alerts).publish_once("dm:alice", send_a, find, _at(3))
    assert posts == ["B", "A"]
