"""Approvals left ``approved`` by a stopped bot end ``incomplete``, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpubot.core.models import ApprovalState as S
from gpubot.errors import AlreadyDecided, ApprovalError
from gpubot.store import Store
from tests.fixtures.approvals import REQUEST

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_approved_then_incomplete_once_and_audited(store: Store) -> None:
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    b = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    pending = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    await store.approvals.decide(a.id, "U2", True, T0 + timedelta(minutes=1))
    await store.approvals.decide(b.id, "U2", True, T0 + timedelta(minutes=5))
    left = await store.approvals.approved(T0 + timedelta(minutes=2))
    assert [x.id for x in left] == [a.id]  # decided before that moment
    left = await store.approvals.approved(T0 + timedelta(hours=1))
    assert [x.id for x in left] == [a.id, b.id] and pending.id not in [x.id for x in left]

    done = await store.approvals.mark_incomplete(a.id, {"error": "gpubot stopped"})
    assert (done.state, done.result) == (S.INCOMPLETE, {"error": "gpubot stopped"})
    assert done.finished_at is not None
    with pytest.raises(AlreadyDecided, match="already incomplete"):
        await store.approvals.mark_incomplete(a.id, {})
    with pytest.raises(AlreadyDecided, match="already incomplete"):
        await store.approvals.mark_executed(a.id, {})
    with pytest.raises(ApprovalError, match="still pending"):  # only an approved one can be
        await store.approvals.mark_incomplete(pending.id, {})
    assert [x.id for x in await store.approvals.approved(T0 + timedelta(hours=1))] == [b.id]

    trail = [r.data for r in await store.records() if r.kind == "approval"]
    assert (trail[-1]["approval"], trail[-1]["from"], trail[-1]["to"]) == (
        a.id,
        "approved",
        "incomplete",
    )
    assert (await store.verify()).ok


async def test_a_retry_take_stamps_taken_at_and_settles_from_it(store: Store) -> None:
    """``approved(before)`` counts from the last take of a retry, else from the decision."""
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    await store.approvals.decide(a.id, "U2", True, T0 + timedelta(minutes=1))
    waiting = await store.approvals.mark_waiting(
        a.id, {"error": "busy"}, now=T0 + timedelta(minutes=2)
    )
    assert waiting.taken_at is None
    taken = await store.approvals.resume(a.id, now=T0 + timedelta(minutes=10))
    assert taken.state is S.APPROVED and taken.taken_at == T0 + timedelta(minutes=10)
    assert taken.decided_at == T0 + timedelta(minutes=1)  # still the approver's decision
    assert await store.approvals.approved(T0 + timedelta(minutes=5)) == []
    left = await store.approvals.approved(T0 + timedelta(minutes=11))
    assert [(x.id, x.taken_at) for x in left] == [(a.id, T0 + timedelta(minutes=10))]
    again = await store.approvals.mark_waiting(
        a.id, {"error": "busy"}, now=T0 + timedelta(minutes=12)
    )
    assert again.taken_at == T0 + timedelta(minutes=10)  # kept: only an approved one is looked at
    await store.approvals.resume(a.id, now=T0 + timedelta(minutes=20))
    assert await store.approvals.approved(T0 + timedelta(minutes=15)) == []


async def test_each_state_read_of_one_source_leaves_the_others(store: Store) -> None:
    """The approval duty of one front end reads only its own approvals (its ``source``)."""
    ids: dict[str, list[int]] = {}
    for source in ("slack", "matrix"):
        made = [
            await store.approvals.create("U1", "alice", "node3", REQUEST, source=source, now=T0)
            for _ in range(3)
        ]
        ids[source] = [a.id for a in made]
        _, approved, waiting = made  # the first stays pending
        await store.approvals.decide(approved.id, "U2", True, T0 + timedelta(minutes=1))
        await store.approvals.decide(waiting.id, "U2", True, T0 + timedelta(minutes=1))
        await store.approvals.mark_waiting(waiting.id, {"error": "busy"}, now=T0)
    later = T0 + timedelta(hours=1)
    for source, (p, a, w) in ids.items():  # pending, approved, waiting
        assert [x.id for x in await store.approvals.pending(source)] == [p]
        assert [x.id for x in await store.approvals.approved(later, source)] == [a]
        assert [x.id for x in await store.approvals.waiting(source)] == [w]
    # the control: with no source, each read is of every front end's
    assert len(await store.approvals.pending()) == len(await store.approvals.waiting()) == 2
    assert len(await store.approvals.approved(later)) == 2
