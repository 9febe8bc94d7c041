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
