"""The one outbox on SQLite, PostgreSQL and memory: the intent to post is recorded with what it
changes (an alert's findings, an approval's state check and audit), in one transaction; a row
changes only on its caller's take; a once-only subject is one row, whoever races for it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.core.alerting import (
    Delivery,
    Intent,
    Lookup,
    MessageRef,
    Notice,
    PendingPost,
    Posted,
    notice,
)
from gpubot.core.approval.posts import Purpose, subject
from gpubot.core.findings import FindingKey, SweepConfig
from gpubot.errors import StoreError
from gpubot.services.outbox import ALERT, Outbox
from gpubot.store import Store, open_store
from gpubot.store.tables import outbox
from tests.fixtures.approvals import REQUEST

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ORPHAN = FindingKey("node3", 2, "orphaned-vram")
ZOMBIE = FindingKey("node3", 0, "zombie-process", "pid:4242:991")
C1 = MessageRef("C1/1.5")


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def _confirmed(store: Store) -> None:
    await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(0))
    await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(5))


def alert(keys: tuple[FindingKey, ...], at: datetime, token: str) -> Intent:
    return Intent(ALERT + "node3", at, keys=keys, token=token)


async def test_the_intent_marks_the_findings_alerted_before_the_post(store: Store) -> None:
    await _confirmed(store)
    pending = await store.outbox.begin(alert((ORPHAN, ZOMBIE), _at(5), "tok1"))
    assert pending is not None
    assert (pending.token, pending.subject, pending.keys) == (
        "tok1",
        "alert:node3",
        (ORPHAN, ZOMBIE),
    )
    assert (pending.since, pending.created_at, pending.repeats) == (_at(0), _at(5), 0)
    assert await store.outbox.pending(ALERT, under=True) == [pending]
    # a sweep after a crash here alerts nothing anew: the state says "alerted", no message yet
    for a in await store.alerts.upsert_seen([ORPHAN, ZOMBIE], _at(10)):
        assert (a.alerted_at, a.ref) == (_at(5), None)
        assert notice(a.key.kind, a, _at(10), SweepConfig()) is Notice.NONE
    # nor does a second intent for the same findings (another replica, a retry)
    assert await store.outbox.begin(alert((ORPHAN,), _at(10), "tok2")) is None

    assert await store.outbox.finish(pending, C1, _at(11)) == [ORPHAN, ZOMBIE]
    assert await store.outbox.pending(ALERT, under=True) == []
    assert {a.ref for a in await store.alerts.open_alerts()} == {C1}
    assert [a.key for a in await store.alerts.on_message(C1)] == [ORPHAN, ZOMBIE]
    trail = [r.data for r in await store.records() if r.kind == "alert"]
    assert [(d["alert"], d["key"], d["token"], d["ref"]) for d in trail] == [
        ("alerted", ORPHAN.text(), "tok1", C1),
        ("alerted", ZOMBIE.text(), "tok1", C1),
    ]
    assert (await store.verify()).ok


async def test_a_refused_post_leaves_the_findings_to_alert_again(store: Store) -> None:
    await _confirmed(store)
    pending = await store.outbox.begin(alert((ORPHAN,), _at(5), "tok1"))
    assert pending is not None
    await store.outbox.cancel(pending, _at(6))
    assert await store.outbox.pending(ALERT, under=True) == []
    orphan = next(a for a in await store.alerts.open_alerts() if a.key == ORPHAN)
    assert orphan.alerted_at is None
    assert notice(ORPHAN.kind, orphan, _at(6), SweepConfig()) is Notice.ALERT
    assert await store.outbox.begin(alert((ORPHAN,), _at(10), "tok2")) is not None


async def test_an_adopted_post_and_an_abandoned_one_are_audited(store: Store) -> None:
    await _confirmed(store)
    p1 = await store.outbox.begin(alert((ORPHAN,), _at(5), "tok1"))
    p2 = await store.outbox.begin(alert((ZOMBIE,), _at(5), "tok2"))
    assert p1 is not None and p2 is not None
    await store.outbox.note_repeat("tok2")
    assert [p.repeats for p in await store.outbox.pending(ALERT, under=True)] == [0, 1]
    await store.outbox.finish(p1, MessageRef("C1/1.7"), _at(6), adopted=True)
    await store.outbox.abandon(p2, "history unreadable", _at(6))
    assert await store.outbox.pending(ALERT, under=True) == []
    trail = [r.data for r in await store.records() if r.kind == "alert"]
    assert trail[0]["adopted"] is True and trail[0]["ref"] == "C1/1.7"
    assert trail[1] == {
        "alert": "not posted",
        "keys": [ZOMBIE.text()],
        "token": "tok2",
        "why": "history unreadable",
    }
    assert _states(store) == {"tok1": "posted", "tok2": "abandoned"}


def _states(store: Store) -> dict[str, str]:
    with store.engine.connect() as conn:
        return {r.token: r.state for r in conn.execute(sa.select(outbox.c.token, outbox.c.state))}


async def test_a_token_is_recorded_once(store: Store) -> None:
    await _confirmed(store)
    await store.outbox.begin(alert((ORPHAN,), _at(5), "tok1"))
    with pytest.raises(StoreError):
        await store.outbox.begin(alert((ZOMBIE,), _at(5), "tok1"))
    with pytest.raises(StoreError, match="no post"):
        await store.outbox.note_repeat("nope")
    # the failed intent changed nothing: ZOMBIE is still to alert
    zombie = next(a for a in await store.alerts.open_alerts() if a.key == ZOMBIE)
    assert zombie.alerted_at is None


async def test_a_message_post_is_apart_from_the_alerts(store: Store) -> None:
    """A single message (an audit head) is recorded under its subject with no finding: the
    alerts' reconcile never sees it, its own subject's does, and it settles the same way."""
    await _confirmed(store)
    await store.outbox.begin(alert((ORPHAN,), _at(5), "alert1"))
    head = await store.outbox.begin(Intent("audit-head", _at(6), token="head1"))
    assert head is not None
    assert (head.token, head.subject, head.keys, head.since) == ("head1", "audit-head", (), _at(6))
    assert [p.token for p in await store.outbox.pending(ALERT, under=True)] == ["alert1"]
    assert [p.token for p in await store.outbox.pending("audit-head")] == ["head1"]
    assert await store.outbox.pending("node3") == []  # a node's name is no subject
    assert await store.outbox.finish(head, MessageRef("C1/2.2"), _at(7)) == []
    assert await store.outbox.pending("audit-head") == []
    head2 = await store.outbox.begin(Intent("audit-head", _at(8), token="head2"))
    assert head2 is not None
    await store.outbox.abandon(head2, "history unreadable", _at(9))
    (rec,) = [r for r in await store.records() if r.kind == "alert"]
    assert rec.node is None and rec.data["message"] == "audit-head" and rec.data["keys"] == []
    assert [p.token for p in await store.outbox.pending(ALERT, under=True)] == ["alert1"]


# -- approvals' posts: one per approval and purpose, in its state --------------------------------


def approval(aid: int, purpose: Purpose, at: datetime, token: str, **audit: Any) -> Intent:
    to = "C0ONCALL/1.000001"
    return Intent(subject(aid, purpose), at, to=to, once=True, token=token, audit=audit or None)


async def test_an_approval_post_is_recorded_once_per_purpose_and_in_its_state(
    store: Store,
) -> None:
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, 900, now=T0)
    posts = store.outbox
    first = await posts.begin(approval(a.id, Purpose.REQUEST, T0, "t1"))
    assert first is not None and first.token == "t1"
    assert await posts.begin(approval(a.id, Purpose.REQUEST, T0, "t2")) is None  # once
    assert await posts.begin(approval(a.id, Purpose.EXPIRED, T0, "t3")) is None  # not expired
    await posts.finish(first, MessageRef("C0ONCALL/1.000001"), T0)
    got = await store.approvals.get(a.id)
    assert got is not None and got.ref == "C0ONCALL/1.000001"  # where its buttons are
    assert await posts.pending("approval:", under=True) == []
    early = T0 + timedelta(seconds=449)  # the control: before half of 900 s
    assert await posts.begin(approval(a.id, Purpose.REPING, early, "t4")) is None
    half = T0 + timedelta(seconds=450)
    reping = approval(a.id, Purpose.REPING, half, "t5", post="reping")
    assert await posts.begin(reping) is not None
    assert await posts.begin(approval(a.id, Purpose.REPING, half, "t6")) is None
    assert await posts.recorded(subject(a.id, Purpose.REPING))
    assert not await posts.recorded(subject(a.id, Purpose.EXPIRED))
    (pending,) = await posts.pending("approval:", under=True)
    assert pending.token == "t5" and pending.to == "C0ONCALL/1.000001"
    await posts.abandon(pending, "history unreadable", half)
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
                s.outbox.begin(approval(a.id, Purpose.REPING, half, f"r{i}"))
                for i, s in enumerate((one, two, one, two))
            )
        )
        assert len([g for g in got if g is not None]) == 1
    finally:
        one.close()
        two.close()


async def test_two_stores_take_a_stale_approval_post_once(fresh_db_url: str) -> None:
    """The take approvals gained: of two replicas settling one lost post, one posts it."""
    one, two = open_store(fresh_db_url), open_store(fresh_db_url)
    try:
        a = await one.approvals.create("U1", "alice", "node3", REQUEST, 900, now=T0)
        post = await one.outbox.begin(approval(a.id, Purpose.REQUEST, T0, "t1"))
        assert post is not None
        late = T0 + timedelta(minutes=2)
        got = await asyncio.gather(*(s.outbox.take("t1", T0, late) for s in (one, two, one, two)))
        assert len([g for g in got if g is not None]) == 1
        await one.outbox.finish(post, MessageRef("C0ONCALL/9.9"), late)  # the lost take
        assert _states(one) == {"t1": "pending"}
    finally:
        one.close()
        two.close()


# -- the take: a poster that lost its row changes nothing ----------------------------------------


@pytest.fixture
def replica(fresh_db_url: str, store: Store) -> Iterator[Store]:
    """A second store over the test's database: another replica of gpubot."""
    s = open_store(fresh_db_url)
    try:
        yield s
    finally:
        s.close()


def _row(store: Store, subject: str) -> tuple[str, str | None]:
    with store.engine.connect() as conn:
        got = conn.execute(
            sa.select(outbox.c.state, outbox.c.ref).where(outbox.c.subject == subject)
        ).one()
    return str(got.state), got.ref


async def _slow_refused_send_then_replica_posts(
    store: Store, replica: Store, posts: list[str]
) -> None:
    """Replica A's send outlives the settle time; B takes the row over, finds it absent and
    posts it; then A's send ends refused."""
    sending, release = asyncio.Event(), asyncio.Event()

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        sending.set()
        await release.wait()
        return Posted(Delivery.REFUSED, why="ratelimited: Retry-After 120")

    async def send_b(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("B")
        return Posted(Delivery.POSTED, MessageRef("D1/1.1"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, MessageRef("D1/1.1") if posts else None)

    a: Outbox[Any] = Outbox(store.outbox)
    slow = asyncio.create_task(a.publish_once("dm:alice", send_a, find, _at(0)))
    await sending.wait()
    b: Outbox[Any] = Outbox(replica.outbox)
    assert await b.publish_once("dm:alice", send_b, find, _at(2))
    release.set()
    assert not await slow  # A's send was refused; the row is not A's to change any more


async def test_a_lost_take_changes_nothing_and_posted_stays_posted(
    store: Store, replica: Store
) -> None:
    posts: list[str] = []
    await _slow_refused_send_then_replica_posts(store, replica, posts)
    assert _row(store, "dm:alice") == ("posted", "D1/1.1")

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("A")
        return Posted(Delivery.POSTED, MessageRef("D1/1.2"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, MessageRef("D1/1.1"))

    # A's next turn: the row is posted, nothing is posted again
    a: Outbox[Any] = Outbox(store.outbox)
    assert await a.publish_once("dm:alice", send_a, find, _at(3)) is None
    assert posts == ["B"]
    # no change from A's take (T0) lands on it: finish, cancel, abandon, a repeat
    with store.engine.connect() as conn:
        token = conn.execute(sa.select(outbox.c.token)).scalar_one()
    old = PendingPost(token, "dm:alice", (), _at(0), _at(0))  # A's take, at T0
    assert await store.outbox.finish(old, MessageRef("D1/9.9"), _at(4)) == []
    await store.outbox.cancel(old, _at(4))
    await store.outbox.abandon(old, "history unreadable", _at(4))
    await store.outbox.note_repeat(token)
    assert _row(store, "dm:alice") == ("posted", "D1/1.1")
    assert not [r for r in await store.records() if r.data.get("alert") == "not posted"]


async def test_control_an_unconditional_update_posts_twice(store: Store, replica: Store) -> None:
    """The attack without the defence: an update of the row by its token alone lets A's late
    "refused" overwrite B's ``posted``, and A's next turn posts again."""
    posts: list[str] = []
    await _slow_refused_send_then_replica_posts(store, replica, posts)
    with store.engine.begin() as conn:  # the unconditional statement
        conn.execute(outbox.update().where(outbox.c.subject == "dm:alice").values(state="refused"))

    async def send_a(token: str, repeat_of: datetime | None) -> Posted:
        posts.append("A")
        return Posted(Delivery.POSTED, MessageRef("D1/1.2"))

    async def find(token: str, since: datetime) -> Lookup:
        return Lookup(True, None)

    a: Outbox[Any] = Outbox(store.outbox)
    assert await a.publish_once("dm:alice", send_a, find, _at(3))
    assert posts == ["B", "A"]
