"""The alert outbox's decisions (``core.alerting.next_step``) and its service
(``services.alert_outbox``) over a scripted notifier and a real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpubot.core import alerting
from gpubot.core.alerting import (
    AlertGroup,
    AlertItem,
    Delivery,
    Lookup,
    Next,
    PendingPost,
    Posted,
    next_step,
)
from gpubot.core.findings import FindingKey
from gpubot.services.alert_outbox import AlertOutbox
from gpubot.store import Store, open_store

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
KEY = FindingKey("node3", 2, "orphaned-vram")
PENDING = PendingPost("t", "node3", (KEY,), T0, T0)


@pytest.mark.parametrize(
    ("lookup", "repeats", "step"),
    [
        (Lookup(True, ("C1", "1.1")), 0, Next.ADOPT),
        (Lookup(False, ("C1", "1.1")), 1, Next.ADOPT),  # found, however the search ended
        (Lookup(True), 0, Next.POST),  # provably absent: post it
        (Lookup(True), 5, Next.POST),
        (Lookup(False, why="missing_scope"), 0, Next.REPEAT),
        (Lookup(False, why="missing_scope"), 1, Next.GIVE_UP),
    ],
)
def test_next_step(lookup: Lookup, repeats: int, step: Next) -> None:
    pending = PendingPost("t", "n", (KEY,), T0, T0, repeats=repeats)
    assert next_step(pending, lookup) is step


UNREADABLE = Lookup(False, why="no scope")


class Scripted:
    """A notifier answering each post as scripted, and every search with ``lookup``."""

    def __init__(self, *answers: Posted, lookup: Lookup = UNREADABLE) -> None:
        self.answers = list(answers)
        self.lookup = lookup
        self.posted: list[AlertGroup] = []

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        self.posted.append(group)
        return self.answers.pop(0) if self.answers else Posted(Delivery.POSTED, ("C1", "9.9"))

    async def find(self, token: str, since: datetime) -> Lookup:
        return self.lookup

    async def update(self, where: tuple[str, str], group: AlertGroup) -> None:
        raise AssertionError("not used")

    async def remind(self, where: tuple[str, str], group: AlertGroup) -> None:
        raise AssertionError("not used")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/a.db")
    yield s
    s.close()


def group(at: datetime = T0, repeat_of: datetime | None = None) -> AlertGroup:
    return AlertGroup("node3", (AlertItem(KEY, None, T0),), None, at, repeat_of=repeat_of)


async def confirmed(store: Store) -> None:
    await store.alerts.upsert_seen([KEY], T0)
    await store.alerts.upsert_seen([KEY], T0 + timedelta(minutes=5))


UNCERTAIN = Posted(Delivery.UNCERTAIN, why="TimeoutError")


async def sweeps(outbox: AlertOutbox, n: int) -> list[tuple[FindingKey, ...]]:
    """Reconcile as ``n`` sweeps do, each rebuilding the pending post's message."""
    out = []
    for i in range(n):
        at = T0 + timedelta(minutes=10 * (i + 1))

        def rebuilt(p: PendingPost, again: datetime | None, at: datetime = at) -> AlertGroup:
            return group(at, again)

        out.append(await outbox.reconcile(rebuilt, at))
    return out


async def test_unconfirmable_posts_end_after_one_repeat(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, UNCERTAIN)
    outbox = AlertOutbox(store.alerts, notifier)
    assert await outbox.post(group()) == ()
    assert await sweeps(outbox, 3) == [(), (), ()]
    assert [g.repeat_of for g in notifier.posted] == [None, T0]  # one repeat, saying so
    assert await store.alerts.pending_posts() == []
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["alert"] == "not posted"
    assert record["keys"] == [KEY.text()] and "no scope" in record["why"]


async def test_control_without_the_limit_every_sweep_repeats(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(alerting, "MAX_REPEATS", 1000)
    await confirmed(store)
    notifier = Scripted(*[UNCERTAIN] * 4)
    outbox = AlertOutbox(store.alerts, notifier)
    await outbox.post(group())
    await sweeps(outbox, 3)
    assert len(notifier.posted) == 4  # the alert, and one more each sweep


async def test_a_refused_post_is_tried_again_by_the_next_sweep(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(Posted(Delivery.REFUSED, why="channel_not_found"))
    outbox = AlertOutbox(store.alerts, notifier)
    assert await outbox.post(group()) == ()
    assert await store.alerts.pending_posts() == []
    assert await outbox.post(group()) == (KEY,)
    (alert,) = await store.alerts.open_alerts()
    assert alert.handle == ("C1", "9.9")


async def test_a_pending_post_whose_findings_cleared_is_not_posted(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, lookup=Lookup(True))  # provably not in the channel
    outbox = AlertOutbox(store.alerts, notifier)
    await outbox.post(group())
    assert await outbox.reconcile(lambda p, again: None, T0) == ()
    assert len(notifier.posted) == 1
    assert await store.alerts.pending_posts() == []
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["why"] == "its findings cleared"


async def test_a_post_provably_absent_is_posted_again_with_its_token(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, lookup=Lookup(True))
    outbox = AlertOutbox(store.alerts, notifier)
    await outbox.post(group())
    (pending,) = await store.alerts.pending_posts()
    assert await sweeps(outbox, 2) == [(KEY,), ()]
    assert [g.repeat_of for g in notifier.posted] == [None, None]  # no "may repeat": checked
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["token"] == pending.token
