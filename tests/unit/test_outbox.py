"""The one outbox (``services.outbox``) and its decisions (``core.alerting.next_step``), over
scripted front ends and a real SQLite store: alerts, messages due once whoever asks, and the
take that lets one caller of two post a pending row."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubot.core import alerting
from gpubot.core.alerting import (
    AlertGroup,
    AlertItem,
    Delivery,
    Intent,
    Lookup,
    MessageRef,
    Next,
    PendingPost,
    Posted,
    next_step,
)
from gpubot.core.findings import FindingKey
from gpubot.core.usage.report import Digest
from gpubot.services.digest import DigestService
from gpubot.services.outbox import ALERT, Outbox
from gpubot.store import AuditRecord, Store, open_store
from gpubot.store.audit_kinds import AuditListing, ListFilter
from tests.fixtures.clock import VirtualClock

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
KEY = FindingKey("node3", 2, "orphaned-vram")
HERE = MessageRef("C1/9.9")
SUBJECT = "dm:claims:offer:7:node2:3:1893499200.0"
ABSENT = Lookup(True)  # the history was read: not there
UNREADABLE = Lookup(False, why="no scope")
UNCERTAIN = Posted(Delivery.UNCERTAIN, why="TimeoutError")


@pytest.mark.parametrize(
    ("lookup", "repeats", "step"),
    [
        (Lookup(True, HERE), 0, Next.ADOPT),
        (Lookup(False, HERE), 1, Next.ADOPT),  # found, however the search ended
        (Lookup(True), 0, Next.POST),  # provably absent: post it
        (Lookup(True), 5, Next.POST),
        (Lookup(False, why="missing_scope"), 0, Next.REPEAT),
        (Lookup(False, why="missing_scope"), 1, Next.GIVE_UP),
    ],
)
def test_next_step(lookup: Lookup, repeats: int, step: Next) -> None:
    pending = PendingPost("t", "n", (KEY,), T0, T0, repeats=repeats)
    assert next_step(pending, lookup) is step


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/a.db")
    yield s
    s.close()


# -- alerts --------------------------------------------------------------------------------------


class Scripted:
    """A notifier answering each post as scripted, and every search with ``lookup``."""

    def __init__(self, *answers: Posted, lookup: Lookup = UNREADABLE) -> None:
        self.answers = list(answers)
        self.lookup = lookup
        self.posted: list[AlertGroup] = []

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        self.posted.append(group)
        return self.answers.pop(0) if self.answers else Posted(Delivery.POSTED, HERE)

    async def find(self, token: str, since: datetime) -> Lookup:
        return self.lookup

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        raise AssertionError("not used")

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        raise AssertionError("not used")


def group(at: datetime = T0) -> AlertGroup:
    return AlertGroup("node3", (AlertItem(KEY, None, T0),), None, at)


async def confirmed(store: Store) -> None:
    await store.alerts.upsert_seen([KEY], T0)
    await store.alerts.upsert_seen([KEY], T0 + timedelta(minutes=5))


async def sweeps(outbox: Outbox[Any], notifier: Scripted, n: int) -> list[tuple[FindingKey, ...]]:
    """Reconcile as ``n`` sweeps do, each rebuilding the pending post's message."""
    out = []
    for i in range(n):
        at = T0 + timedelta(minutes=10 * (i + 1))

        def rebuilt(p: PendingPost, at: datetime = at) -> AlertGroup:
            return group(at)

        out.append(await outbox.reconcile_alerts(notifier, rebuilt, at))
    return out


async def test_unconfirmable_posts_end_after_one_repeat(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, UNCERTAIN)
    outbox: Outbox[Any] = Outbox(store.outbox)
    assert await outbox.post_alert(group(), notifier) == ()
    assert await sweeps(outbox, notifier, 3) == [(), (), ()]
    assert [g.repeat_of for g in notifier.posted] == [None, T0]  # one repeat, saying so
    assert await store.outbox.pending(ALERT, under=True) == []
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["alert"] == "not posted"
    assert record["keys"] == [KEY.text()] and "no scope" in record["why"]


async def test_control_without_the_limit_every_sweep_repeats(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(alerting, "MAX_REPEATS", 1000)
    await confirmed(store)
    notifier = Scripted(*[UNCERTAIN] * 4)
    outbox: Outbox[Any] = Outbox(store.outbox)
    await outbox.post_alert(group(), notifier)
    await sweeps(outbox, notifier, 3)
    assert len(notifier.posted) == 4  # the alert, and one more each sweep


async def test_a_refused_post_is_tried_again_by_the_next_sweep(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(Posted(Delivery.REFUSED, why="channel_not_found"))
    outbox: Outbox[Any] = Outbox(store.outbox)
    assert await outbox.post_alert(group(), notifier) == ()
    assert await store.outbox.pending(ALERT, under=True) == []
    assert await outbox.post_alert(group(), notifier) == (KEY,)
    (alert,) = await store.alerts.open_alerts()
    assert alert.ref == HERE


async def test_a_pending_post_whose_findings_cleared_is_not_posted(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, lookup=Lookup(True))  # provably not in the channel
    outbox: Outbox[Any] = Outbox(store.outbox)
    await outbox.post_alert(group(), notifier)
    assert await outbox.reconcile_alerts(notifier, lambda p: None, T0) == ()
    assert len(notifier.posted) == 1
    assert await store.outbox.pending(ALERT, under=True) == []
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["why"] == "its findings cleared"


async def test_a_post_provably_absent_is_posted_again_with_its_token(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, lookup=Lookup(True))
    outbox: Outbox[Any] = Outbox(store.outbox)
    await outbox.post_alert(group(), notifier)
    (pending,) = await store.outbox.pending(ALERT, under=True)
    assert await sweeps(outbox, notifier, 2) == [(KEY,), ()]
    assert [g.repeat_of for g in notifier.posted] == [None, None]  # no "may repeat": checked
    (record,) = [r.data for r in await store.records() if r.kind == "alert"]
    assert record["token"] == pending.token


# -- messages due once, whoever asks ------------------------------------------------------------


class Slack:
    """Posts as scripted (else posted), and finds what ``found`` says."""

    def __init__(self, *answers: Posted, found: Lookup = ABSENT) -> None:
        self.answers = list(answers)
        self.found = found
        self.sent: list[tuple[str, datetime | None]] = []

    async def send(self, token: str, repeat_of: datetime | None) -> Posted:
        self.sent.append((token, repeat_of))
        return self.answers.pop(0) if self.answers else Posted(Delivery.POSTED, HERE)

    async def find(self, token: str, since: datetime) -> Lookup:
        return self.found


def lost() -> Slack:
    """Two posts whose answers are lost, and a history nobody can read."""
    return Slack(Posted(Delivery.UNCERTAIN, why="HTTP 500"), UNCERTAIN, found=UNREADABLE)


async def test_a_message_due_again_is_posted_once(store: Store) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    slack = Slack()
    assert await outbox.publish_once(SUBJECT, slack.send, slack.find, T0) is True
    later = T0 + timedelta(hours=1)  # another tick, another process, a restart: the same
    assert await outbox.publish_once(SUBJECT, slack.send, slack.find, later) is None  # there
    assert len(slack.sent) == 1


async def test_control_publish_posts_each_time_it_is_asked(store: Store) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    slack = Slack()
    for at in (T0, T0 + timedelta(hours=1)):
        assert await outbox.publish(SUBJECT, slack.send, slack.find, at, repeat=True) == HERE
    assert len(slack.sent) == 2


async def test_a_post_left_pending_is_settled_by_the_next_caller_after_the_settle_time(
    store: Store,
) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = lost()
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, T0) is False
    assert [r for _, r in gone.sent] == [None, T0]  # once more, saying it may repeat
    assert [p.subject for p in await store.outbox.pending(SUBJECT)] == [SUBJECT]
    soon, found = T0 + timedelta(seconds=30), Slack(found=Lookup(True, HERE))
    assert await outbox.publish_once(SUBJECT, found.send, found.find, soon) is False  # young
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, found.send, found.find, late) is True  # adopted
    assert found.sent == [] and await store.outbox.pending(SUBJECT) == []


async def test_a_pending_post_provably_absent_is_posted_again_with_its_token(
    store: Store,
) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = lost()
    await outbox.publish_once(SUBJECT, gone.send, gone.find, T0)
    absent = Slack(found=ABSENT)
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, absent.send, absent.find, late) is True
    assert absent.sent == [(gone.sent[0][0], None)]


async def test_a_refused_message_is_posted_by_the_next_caller_and_then_never_again(
    store: Store,
) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    refused = Slack(Posted(Delivery.REFUSED, why="ratelimited"))
    assert await outbox.publish_once(SUBJECT, refused.send, refused.find, T0) is False
    # The control (before): a refused row was "done", and the DM lost for good.
    again, soon = Slack(), T0 + timedelta(seconds=1)  # no settle time: it is not there
    assert await outbox.publish_once(SUBJECT, again.send, again.find, soon) is True
    assert again.sent == [(refused.sent[0][0], None)]  # its own token, said once
    late = Slack()
    assert await outbox.publish_once(SUBJECT, late.send, late.find, soon) is None
    assert late.sent == []  # posted: never again


async def test_a_message_given_up_is_looked_for_then_posted_by_the_next_caller(
    store: Store,
) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = lost()
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, T0) is False
    late = T0 + timedelta(minutes=2)  # settled: the history still unreadable, given up
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, late) is False
    assert len(gone.sent) == 2 and await store.outbox.pending(SUBJECT) == []
    readable = Slack(found=ABSENT)  # later: the history is read, and it is not there
    assert await outbox.publish_once(SUBJECT, readable.send, readable.find, late) is True
    assert readable.sent == [(gone.sent[0][0], None)]
    assert await outbox.publish_once(SUBJECT, readable.send, readable.find, late) is None
    assert len(readable.sent) == 1


async def test_a_message_given_up_and_found_is_adopted_not_posted_again(store: Store) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = lost()
    await outbox.publish_once(SUBJECT, gone.send, gone.find, T0)
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, late) is False  # given up
    found = Slack(found=Lookup(True, HERE))
    assert await outbox.publish_once(SUBJECT, found.send, found.find, late) is True
    assert found.sent == []


async def test_never_a_second_post_on_a_guess_when_told_not_to_repeat(store: Store) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = Slack(UNCERTAIN, found=UNREADABLE)
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, T0, repeat=False) is False
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, late, repeat=False) is False
    assert len(gone.sent) == 1  # the control (``repeat``): a second post saying it may repeat
    assert [p.subject for p in await store.outbox.pending(SUBJECT)] == [SUBJECT]


# -- the take: of two callers, one posts -------------------------------------------------------


async def test_a_stale_row_is_taken_by_one_caller_and_a_lost_take_changes_nothing(
    store: Store,
) -> None:
    first = await store.outbox.begin(Intent("approval-less", T0))
    assert first is not None
    late = T0 + timedelta(minutes=2)
    one = await store.outbox.take(first.token, T0, late)
    two = await store.outbox.take(first.token, T0, late)
    assert one is not None and two is None  # one caller of two holds the row
    assert await store.outbox.take(first.token, T0, late + timedelta(seconds=1)) is None
    await store.outbox.finish(first, HERE, late)  # the first poster's late answer: ignored
    (still,) = await store.outbox.pending("approval-less")
    assert still.take == late
    await store.outbox.finish(one, HERE, late)
    assert await store.outbox.pending("approval-less") == []
    # The control: the holder of the current take records where it landed.
    assert await store.outbox.take(first.token, late, late) is None  # posted: never again


# -- review: what each post carries, a clock stepped back, the digest's audit trail -------------

OTHER = FindingKey("node3", 1, "orphaned-vram")


async def test_an_alert_carries_only_the_findings_its_record_marked(store: Store) -> None:
    for i in range(2):
        await store.alerts.upsert_seen([KEY, OTHER], T0 + timedelta(minutes=5 * i))
    notifier = Scripted()
    outbox: Outbox[Any] = Outbox(store.outbox)
    assert await outbox.post_alert(group(), notifier) == (KEY,)
    both = AlertGroup("node3", (AlertItem(KEY, None, T0), AlertItem(OTHER, None, T0)), None, T0)
    assert await outbox.post_alert(both, notifier) == (OTHER,)
    assert [i.key for i in notifier.posted[1].items] == [OTHER]  # KEY was posted already


async def test_a_pending_alert_is_settled_after_the_clock_steps_back(store: Store) -> None:
    await confirmed(store)
    notifier = Scripted(UNCERTAIN, lookup=ABSENT)  # the answer lost; provably not there
    outbox: Outbox[Any] = Outbox(store.outbox)
    assert await outbox.post_alert(group(), notifier) == ()
    back = T0 - timedelta(hours=1)  # the wall clock steps back an hour
    assert await outbox.reconcile_alerts(notifier, lambda p: group(back), back) == (KEY,)
    assert len(notifier.posted) == 2


async def test_control_a_take_a_little_ahead_of_the_clock_is_still_held(store: Store) -> None:
    first = await store.outbox.begin(Intent("approval-less", T0))
    assert first is not None
    behind = T0 - timedelta(seconds=30)  # another replica's clock, a little behind
    assert await store.outbox.take(first.token, behind, behind) is None
    assert await store.outbox.take(first.token, T0 - timedelta(hours=1), T0) is None


async def test_a_message_pending_is_taken_over_after_the_clock_steps_back(store: Store) -> None:
    outbox: Outbox[Any] = Outbox(store.outbox)
    gone = Slack(UNCERTAIN, found=UNREADABLE)
    assert await outbox.publish_once(SUBJECT, gone.send, gone.find, T0, repeat=False) is False
    found, back = Slack(found=Lookup(True, HERE)), T0 - timedelta(hours=1)
    assert await outbox.publish_once(SUBJECT, found.send, found.find, back) is True  # adopted


class Weekly:
    """The digest's front end: each post answered as scripted (else posted at ``HERE``)."""

    def __init__(self, *answers: Posted) -> None:
        self.answers = list(answers)

    async def post(self, report: object, *, token: str) -> Posted:
        return self.answers.pop(0) if self.answers else Posted(Delivery.POSTED, HERE)

    async def find(self, token: str, since: datetime) -> Lookup:
        return ABSENT


class Hours:
    async def report_of(self, window: object, by: str, now: float) -> str:
        return "report"


async def test_the_digest_s_posts_are_audited_under_kind_digest(store: Store) -> None:
    digest = Digest.parse("mon 09:00")
    clock = VirtualClock(digest.last_due(T0.timestamp()) + 60)
    notifier = Weekly(Posted(Delivery.REFUSED, why="not_in_channel"))
    usage: Any = Hours()
    svc = DigestService(digest, "user", usage, Outbox(store.outbox), notifier, clock=clock)
    assert await svc.run_due() is None  # refused
    clock.step(60.0)
    assert await svc.run_due() is not None  # tried again: posted
    listed = await AuditListing(store.engine).list(ListFilter(("digest",)))
    ends = [r.data for r in reversed(listed) if isinstance(r, AuditRecord) and "outcome" in r.data]
    assert [(e["outcome"], e.get("ref")) for e in ends] == [("refused", None), ("posted", HERE)]
    assert not await AuditListing(store.engine).list(ListFilter(("alert",)))
