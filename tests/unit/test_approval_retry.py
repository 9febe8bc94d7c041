"""Approved means run or told (issue 34), over the memory store, in-process leases and a virtual
clock: an approval whose holder stopped is reported once its lease lapses, not only at
start-up; an approved reset refused because its node is busy waits, is retried and runs when
the node frees, or ends told once its approval lapses. The thread and the requester hear each
once (the approval outbox, with a poster that records what it was given).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import pytest

from gpubot.chat.approval_words import ApprovalWords
from gpubot.chat.message import Message
from gpubot.config import parse
from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import Approval
from gpubot.core.approval.posts import Purpose
from gpubot.core.models import ApprovalState
from gpubot.core.policy import Person
from gpubot.errors import LockHeld
from gpubot.services.approval_duty import ApprovalDuty
from gpubot.services.approvals import ApprovalPorts, ApprovalService
from gpubot.services.locks import NodeLocks
from gpubot.services.outbox import Outbox
from gpubot.services.reset import Ask, ResetService, reset_lock
from gpubot.store import Store, open_store
from tests.fixtures.approvals import REQUEST, LeasedReset, Poster
from tests.fixtures.clock import VirtualClock

S = ApprovalState
CAROL = Person("U0CAROL", "carol", "carol")  # on call
EXPIRY_S = 900.0
SETTLED_S = 30.0  # the lease's ttl
H = 3600.0


@dataclass
class Bot:
    store: Store
    clock: VirtualClock
    locks: NodeLocks
    reset: LeasedReset
    approvals: ApprovalService
    duty: ApprovalDuty[Message]
    poster: Poster

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    async def approved(self) -> Approval:
        """A forced kill of bob's job asked by alice in Slack, posted, approved by carol."""
        a = await self.store.approvals.create(
            "U0ALICE", "alice", "node3", REQUEST, EXPIRY_S, source="slack", now=self.now()
        )
        await self.store.approvals.set_message(a.id, MessageRef("C0ONCALL/1.0"))
        return await self.approvals.decide(a.id, Ask(CAROL, f"approve {a.id}", "slack"), True)


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def bot(store: Store) -> AsyncIterator[Bot]:
    clock = VirtualClock()
    settings = parse(
        {
            "nodes": [{"name": "node3", "host": "node3.lab"}],
            "approvals": {"approvers": ["U0CAROL"], "expiry_s": EXPIRY_S},
            "slack": {"oncall_channel": "C0ONCALL"},
        },
        "retry.toml",
    )
    locks = NodeLocks(clock)
    reset = LeasedReset(locks)
    ports = ApprovalPorts(store.approvals, cast(ResetService, reset), store, clock=clock)
    approvals = ApprovalService(settings.policy, ports)
    poster = Poster(store)
    outbox = Outbox(store.outbox, poster, clock=clock)
    words = ApprovalWords(settings.policy.expiry_s)
    duty = ApprovalDuty(approvals, outbox, words, front="slack", settled_s=SETTLED_S)
    yield Bot(store, clock, locks, reset, approvals, duty, poster)


async def state(bot: Bot, a: Approval) -> S:
    found = await bot.store.approvals.get(a.id)
    assert found is not None
    return found.state


async def test_an_interrupted_approval_is_reported_once_its_lease_lapses(bot: Bot) -> None:
    a = await bot.approved()
    # The killed holder's lease is still in force: the start-up look (and the next) skip it.
    async with bot.locks.hold(reset_lock("node3"), holder="U0CAROL (killed)"):
        await bot.clock.advance(SETTLED_S + 1)
        assert await bot.approvals.abandon_approved() == []  # the old, start-up-only look
        assert await bot.duty.look_again() == []
        assert await state(bot, a) is S.APPROVED and bot.poster.posts == []
    # The lease lapsed: the next run of the duty reports it, in its thread and to alice.
    (marked,) = await bot.duty.look_again()
    assert marked.id == a.id and marked.state is S.INCOMPLETE
    (thread,) = bot.poster.of(Purpose.INTERRUPTED)
    assert thread[1:3] == ("C0ONCALL", "1.0") and "was interrupted" in thread[3]
    (dm,) = bot.poster.of(Purpose.INTERRUPTED_DM)
    assert dm[1] == "D-U0ALICE" and "not run again" in dm[3]
    assert await bot.duty.look_again() == [] and len(bot.poster.posts) == 2  # once
    assert bot.reset.runs == []  # an interrupted kill is never run again


async def test_a_just_decided_or_running_approval_is_not_taken_for_interrupted(bot: Bot) -> None:
    a = await bot.approved()
    assert await bot.duty.look_again() == []  # decided just now: a replica may be leasing it
    await bot.clock.advance(SETTLED_S + 1)
    bot.approvals.running.add(a.id)  # this process runs it
    assert await bot.duty.look_again() == [] and await state(bot, a) is S.APPROVED


async def test_a_reset_refused_as_busy_waits_is_retried_and_runs_when_the_node_frees(
    bot: Bot,
) -> None:
    a = await bot.approved()
    async with bot.locks.hold(reset_lock("node3"), holder="bob's own reset"):
        with pytest.raises(LockHeld):
            await bot.approvals.execute(a, source="slack")
        assert await state(bot, a) is S.WAITING and bot.reset.runs == []
        await bot.clock.advance(30)
        assert [x.id for x in await bot.duty.look_again()] == [a.id]  # told, still busy
        (told,) = bot.poster.of(Purpose.WAITING)
        assert told[1:3] == ("C0ONCALL", "1.0")
        assert "could not run yet: reset:node3 is busy: held by bob's own reset" in told[3]
        assert "U0ALICE" in told[3] and "U0CAROL" in told[3]  # requester and approver named
        assert await state(bot, a) is S.WAITING and bot.reset.runs == []
    await bot.clock.advance(30)
    (ran,) = await bot.duty.look_again()
    assert ran.state is S.EXECUTED and bot.reset.runs == [a.id]
    (retried,) = bot.poster.of(Purpose.RETRIED)
    assert "ran on a retry: every GPU freed" in retried[3]
    assert await bot.duty.look_again() == [] and bot.reset.runs == [a.id]  # once


async def test_control_without_the_busy_lease_it_runs_at_once(bot: Bot) -> None:
    a = await bot.approved()
    await bot.approvals.execute(a, source="slack")
    assert await state(bot, a) is S.EXECUTED and bot.reset.runs == [a.id]
    assert await bot.duty.look_again() == [] and bot.poster.posts == []


async def test_a_node_busy_until_the_approval_lapses_ends_failed_and_told(bot: Bot) -> None:
    a = await bot.approved()
    async with bot.locks.hold(reset_lock("node3"), holder="a long reset"):
        with pytest.raises(LockHeld):
            await bot.approvals.execute(a, source="slack")
        await bot.clock.advance(EXPIRY_S / 2)
        await bot.duty.look_again()
        assert await state(bot, a) is S.WAITING
        await bot.clock.advance(EXPIRY_S / 2)
        (ended,) = await bot.duty.look_again()
    assert ended.state is S.FAILED and bot.reset.runs == []
    (gave_up,) = bot.poster.of(Purpose.GAVE_UP)
    assert "never ran" in gave_up[3] and "busy" in gave_up[3] and "/gpu reset node3" in gave_up[3]
    assert await bot.duty.look_again() == []


async def test_a_wait_the_store_could_not_take_is_recorded_later_not_abandoned(
    bot: Bot,
) -> None:
    a = await bot.approved()
    bot.approvals.unrecorded[a.id] = "the database is unreachable"  # as ``_not_run`` leaves it
    await bot.clock.advance(SETTLED_S + 1)
    await bot.duty.look_again()
    assert bot.poster.of(Purpose.INTERRUPTED) == [] and a.id not in bot.approvals.unrecorded
    assert bot.reset.runs == [a.id]  # recorded as waiting, then retried: the node was free


async def test_one_the_start_up_look_marked_is_told_by_the_duty_once(bot: Bot) -> None:
    a = await bot.approved()
    await bot.clock.advance(1)
    (marked,) = await bot.approvals.abandon_approved()  # start-up: its lease had lapsed
    assert marked.id == a.id and bot.poster.posts == []
    assert [x.id for x in await bot.duty.look_again()] == [a.id]
    assert len(bot.poster.of(Purpose.INTERRUPTED)) == 1 and await bot.duty.look_again() == []


async def _busy_then_free_after_a_step_back(bot: Bot) -> Approval:
    """An approved kill waits (its node busy) while the wall clock steps back an hour; the node
    frees only once the approval's real time (monotonic) is over; return it as it ends."""
    a = await bot.approved()
    async with bot.locks.hold(reset_lock("node3"), holder="a long reset"):
        with pytest.raises(LockHeld):
            await bot.approvals.execute(a, source="slack")
        bot.clock.step(-H)  # NTP, or a VM snapshot restored: the approval's hour again
        await bot.clock.advance(EXPIRY_S / 2)
        await bot.duty.look_again()
        assert await state(bot, a) is S.WAITING  # still valid by both clocks: retried
        await bot.clock.advance(EXPIRY_S / 2)
    await bot.duty.look_again()  # the node is free; the wall clock says 45 min are left
    found = await bot.store.approvals.get(a.id)
    assert found is not None
    return found


async def test_a_wall_clock_stepped_back_never_runs_an_approval_past_its_validity(
    bot: Bot,
) -> None:
    ended = await _busy_then_free_after_a_step_back(bot)
    assert ended.state is S.FAILED and bot.reset.runs == []
    (gave_up,) = bot.poster.of(Purpose.GAVE_UP)
    assert "never ran" in gave_up[3]


async def test_control_judged_by_the_wall_clock_alone_it_runs_late(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wall(clock: VirtualClock, valid_s: float) -> datetime:  # as before the fix
        return datetime.fromtimestamp(clock.now(), UTC)

    for module in ("approvals", "approval_retry"):
        monkeypatch.setattr(f"gpubot.services.{module}.run_now", wall)
    ended = await _busy_then_free_after_a_step_back(bot)
    assert ended.state is S.EXECUTED and bot.reset.runs == [ended.id]  # 15 min past its time


async def test_a_wall_clock_stepped_forward_gives_it_up_told(bot: Bot) -> None:
    """Forward, the wall clock is the later: giving up early is the safe side (it is told)."""
    a = await bot.approved()
    async with bot.locks.hold(reset_lock("node3"), holder="a long reset"):
        with pytest.raises(LockHeld):
            await bot.approvals.execute(a, source="slack")
        bot.clock.step(H)
        await bot.clock.advance(1)
        await bot.duty.look_again()
    assert await state(bot, a) is S.FAILED and bot.reset.runs == []
