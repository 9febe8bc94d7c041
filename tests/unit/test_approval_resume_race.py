"""A retry's resume is never taken for an interruption by another replica (issue 34).

Two replicas, A and B, share one store (memory), one lease table (in-process leases) and a
virtual clock. A's retry takes a waiting approval back to ``approved`` long after it was
decided; B's periodic interrupted look runs after A's resume but before A holds the node's
lease. The look counts the settling time from the take (``taken_at``), not from the decision,
so it leaves the approval alone; without the stamp it marks it ``incomplete`` and its requester
would be told "interrupted" about a kill that is about to run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import pytest

from gpubot.config import parse
from gpubot.core.approval.model import Approval
from gpubot.core.models import ApprovalState
from gpubot.core.policy import Person
from gpubot.errors import LockHeld
from gpubot.services.approval_retry import ApprovalRetry
from gpubot.services.approvals import ApprovalPorts, ApprovalService
from gpubot.services.locks import NodeLocks
from gpubot.services.reset import Ask, ResetService, reset_lock
from gpubot.store import Store, open_store
from gpubot.store.tables import approvals as approvals_table
from tests.fixtures.approvals import REQUEST, LeasedReset
from tests.fixtures.clock import VirtualClock

S = ApprovalState
CAROL = Person("U0CAROL", "carol", "carol")  # on call
EXPIRY_S = 900.0
SETTLED_S = 30.0  # the lease's ttl


@dataclass
class Replica:
    approvals: ApprovalService
    retry: ApprovalRetry
    reset: LeasedReset


@dataclass
class Fleet:
    store: Store
    clock: VirtualClock
    locks: NodeLocks  # the shared lease table
    a: Replica
    b: Replica

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    async def approved(self) -> Approval:
        """A forced kill asked by alice and approved by carol, through replica A."""
        now = self.now()
        a = await self.store.approvals.create(
            "U0ALICE", "alice", "node3", REQUEST, EXPIRY_S, source="slack", now=now
        )
        return await self.a.approvals.decide(a.id, Ask(CAROL, f"approve {a.id}", "slack"), True)

    async def waiting_long_after_its_decision(self) -> Approval:
        """An approved kill refused as busy (waiting), its node freed well past ``settled_s``
        after the decision."""
        a = await self.approved()
        async with self.locks.hold(reset_lock("node3"), holder="bob's own reset"):
            with pytest.raises(LockHeld):
                await self.a.approvals.execute(a, source="slack")
            await self.clock.advance(2 * SETTLED_S)
        assert await self.state(a) is S.WAITING
        return a

    async def state(self, a: Approval) -> S:
        found = await self.store.approvals.get(a.id)
        assert found is not None
        return found.state


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def fleet(store: Store) -> AsyncIterator[Fleet]:
    clock = VirtualClock()
    settings = parse(
        {
            "nodes": [{"name": "node3", "host": "node3.lab"}],
            "approvals": {"approvers": ["U0CAROL"], "expiry_s": EXPIRY_S},
        },
        "race.toml",
    )
    locks = NodeLocks(clock)

    def replica() -> Replica:
        reset = LeasedReset(locks)
        ports = ApprovalPorts(store.approvals, cast(ResetService, reset), store, clock=clock)
        service = ApprovalService(settings.policy, ports)
        return Replica(service, ApprovalRetry(service, settled_s=SETTLED_S), reset)

    yield Fleet(store, clock, locks, replica(), replica())


async def test_a_just_resumed_approval_is_not_marked_incomplete_by_another_replica(
    fleet: Fleet,
) -> None:
    a = await fleet.waiting_long_after_its_decision()
    seen: list[list[Approval]] = []

    async def b_looks() -> None:  # A has resumed it and not yet taken the node's lease
        assert await fleet.state(a) is S.APPROVED
        seen.append(await fleet.b.retry.interrupted())

    fleet.a.reset.before_hold = b_looks
    (ran,) = await fleet.a.retry.retry()
    assert seen == [[]]  # B left it alone
    assert ran.state is S.EXECUTED and fleet.a.reset.runs == [a.id]
    assert ran.taken_at is not None and ran.decided_at is not None
    assert ran.taken_at > ran.decided_at


async def test_control_without_the_taken_at_stamp_it_is_marked_incomplete(
    fleet: Fleet,
) -> None:
    a = await fleet.waiting_long_after_its_decision()
    seen: list[list[Approval]] = []

    async def b_looks() -> None:  # as before the fix: the row keeps only its decision time
        with fleet.store.engine.begin() as conn:
            conn.execute(
                approvals_table.update().where(approvals_table.c.id == a.id).values(taken_at=None)
            )
        seen.append(await fleet.b.retry.interrupted())

    fleet.a.reset.before_hold = b_looks
    await fleet.a.retry.retry()
    assert [[x.id for x in found] for found in seen] == [[a.id]]
    assert await fleet.state(a) is S.INCOMPLETE  # "interrupted", told while A goes on to run it


async def test_a_replica_that_dies_after_its_resume_is_still_found_once_settled(
    fleet: Fleet,
) -> None:
    a = await fleet.waiting_long_after_its_decision()
    taken = await fleet.store.approvals.resume(a.id, now=fleet.now())
    assert taken.state is S.APPROVED  # A took it, then stopped before holding the lease
    assert await fleet.b.retry.interrupted() == []  # just taken: it may be about to run
    await fleet.clock.advance(SETTLED_S + 1)
    (marked,) = await fleet.b.retry.interrupted()
    assert marked.id == a.id and marked.state is S.INCOMPLETE
    assert fleet.a.reset.runs == fleet.b.reset.runs == []
