"""A DM to a person another front end reaches is handed over through the store and posted by the
process whose front end reaches them, once, through the one outbox (``chat.dm_route``), on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from gpubot.chat.dm_route import KEEP_S, RETRY_S, DmRoute
from gpubot.chat.message import Message, Section, bold
from gpubot.core.ports import DueDm
from gpubot.services.outbox import Outbox
from gpubot.store import Store
from tests.fixtures.approvals import Poster
from tests.fixtures.settings import ManualClock

MSG = Message(
    "Free · node2",
    (
        Section(
            ("GPU 1 is ", bold("free")),
        ),
    ),
)
SUBJECT = "dm:claims:offer:7:node2:1:1700000000.0"


def on_slack(user: str) -> bool:
    return user.startswith("U")


def on_matrix(user: str) -> bool:
    return user.startswith("@")


def front(
    store: Store, reaches: Callable[[str], bool], clock: ManualClock
) -> tuple[DmRoute, Poster]:
    """One process's route over the store, its DMs posted once through a real outbox."""
    poster = Poster()
    outbox: Outbox[Message] = Outbox(store.outbox, poster)

    async def own(user: str, msg: Message, subject: str) -> bool:
        return await outbox.send_once(subject, f"D-{user}", msg)

    return DmRoute(own, reaches, store.dm_due, clock=clock), poster


async def test_a_person_of_the_other_front_end_gets_the_dm_from_its_process(store: Store) -> None:
    clock = ManualClock()
    slack, slack_posts = front(store, on_slack, clock)
    matrix, matrix_posts = front(store, on_matrix, clock)
    assert await slack("@bob:lab", MSG, SUBJECT)  # kept: not lost, not asked again
    assert slack_posts.sent == [] and await slack.deliver() == 0  # not Slack's to post
    (kept,) = await store.dm_due.due()
    assert (kept.subject, kept.to) == (SUBJECT, "@bob:lab")
    assert await matrix.deliver() == 1
    ((_, to, text),) = matrix_posts.sent
    assert to == "D-@bob:lab" and text == str(MSG)  # the message as rendered
    assert await store.dm_due.due() == [] and await matrix.deliver() == 0


async def test_its_own_person_gets_it_at_once_and_nothing_is_kept(store: Store) -> None:
    slack, posts = front(store, on_slack, ManualClock())
    assert await slack("U0BOB", MSG, SUBJECT)
    assert [to for _, to, _ in posts.sent] == ["D-U0BOB"] and await store.dm_due.due() == []


async def test_control_without_a_store_the_other_front_ends_dm_is_not_sent(store: Store) -> None:
    clock = ManualClock()
    slack, _ = front(store, on_slack, clock)
    slack.due = None  # the defence taken away: nowhere to hand it
    matrix, matrix_posts = front(store, on_matrix, clock)
    assert not await slack("@bob:lab", MSG, SUBJECT)  # the caller asks again, or it is lost
    assert await matrix.deliver() == 0 and matrix_posts.sent == []


async def test_two_replicas_of_the_reaching_front_end_post_it_once(store: Store) -> None:
    clock = ManualClock()
    slack, _ = front(store, on_slack, clock)
    (a, a_posts), (b, b_posts) = front(store, on_matrix, clock), front(store, on_matrix, clock)
    assert await slack("@bob:lab", MSG, SUBJECT)
    assert await slack("@bob:lab", MSG, SUBJECT)  # told twice: still one kept
    assert len(await store.dm_due.due()) == 1
    await asyncio.gather(a.deliver(), b.deliver())
    assert len(a_posts.sent + b_posts.sent) == 1  # the outbox's subject: once in all
    assert await store.dm_due.due() == []


async def test_a_failed_post_is_tried_again_later_and_later(store: Store) -> None:
    clock = ManualClock()
    slack, _ = front(store, on_slack, clock)
    tries: list[float] = []

    async def refused(user: str, msg: Message, subject: str) -> bool:
        tries.append(clock.now())
        return len(tries) > 2  # refused twice, then taken

    matrix = DmRoute(refused, on_matrix, store.dm_due, clock=clock)
    assert await slack("@bob:lab", MSG, SUBJECT)
    start = clock.now()
    for step in (0.0, 1.0, RETRY_S, RETRY_S, RETRY_S):  # each turn of the duty
        clock.advance(step)
        await matrix.deliver()
    assert await store.dm_due.due() == []
    # tried at once, again after RETRY_S, then after twice that: not on every turn
    assert [t - start for t in tries] == [0.0, 1.0 + RETRY_S, 1.0 + 3 * RETRY_S]


async def test_the_console_takes_no_one_elses_dm(store: Store) -> None:
    """A front end with no ids of its own (the console) reaches anyone it is given: it must not
    print, and so take, what another front end's process handed over."""
    clock = ManualClock()
    slack, _ = front(store, on_slack, clock)
    printed: list[str] = []

    async def echo(user: str, msg: Message, subject: str) -> bool:
        printed.append(user)
        return True

    console = DmRoute(echo, lambda _: True, store.dm_due, takes=False, clock=clock)
    assert await slack("@bob:lab", MSG, SUBJECT)
    assert await console.deliver() == 0 and printed == []
    assert len(await store.dm_due.due()) == 1  # left for the Matrix process
    console.takes = True  # the control: a console that took them
    assert await console.deliver() == 1 and printed == ["@bob:lab"]


async def test_one_nobody_delivers_in_time_is_given_up_and_said(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    slack, _ = front(store, on_slack, clock)
    assert await slack("@bob:lab", MSG, SUBJECT)  # no Matrix process serves
    clock.advance(KEEP_S - 1)
    assert await slack.deliver() == 0 and len(await store.dm_due.due()) == 1
    clock.advance(2)
    with caplog.at_level(logging.ERROR):
        assert await slack.deliver() == 0
    assert await store.dm_due.due() == []
    assert f"{SUBJECT}: no front end delivered the DM to @bob:lab in time: given up" in caplog.text


async def test_an_unreadable_one_is_left_to_age_said_in_one_line(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreadable here (perhaps a newer gpubot's message): not posted, not deleted, so a
    process that reads it may; it ages out as any other."""
    clock = ManualClock()
    await store.dm_due.hand(DueDm(SUBJECT, "@bob:lab", '{"@":"Popen"}', clock.now()))
    matrix, posts = front(store, on_matrix, clock)
    with caplog.at_level(logging.ERROR):
        assert await matrix.deliver() == 0
    assert posts.sent == [] and len(await store.dm_due.due()) == 1
    assert "is unreadable: not a message" in caplog.text
    clock.advance(KEEP_S + 1)
    assert await matrix.deliver() == 0 and await store.dm_due.due() == []


async def test_a_message_holding_a_place_is_not_handed_over(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    from gpubot.chat.message import Place

    slack, _ = front(store, on_slack, ManualClock())
    linked = Message(None, (Section(("see ", Place("C0ALERTS/1.2"))),))
    with caplog.at_level(logging.ERROR):
        assert not await slack("@bob:lab", linked, SUBJECT)
    assert await store.dm_due.due() == [] and "cannot be handed over" in caplog.text
