"""Approvals on SQLite and PostgreSQL: transitions, expiry, no self-approval, exactly once."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpubot.core.alerting import MessageRef
from gpubot.core.models import ApprovalState as S
from gpubot.errors import (
    AlreadyDecided,
    ApprovalError,
    ApprovalExpired,
    GpubotError,
    SelfApproval,
)
from gpubot.store import Approval, Store, open_store
from tests.fixtures.approvals import REQUEST

# The request's JSON as rows (and the audit chain) hold it: the plan's fields at the top level.
STORED = json.loads(
    json.dumps(
        {
            **REQUEST.plan.to_dict(),
            "grace_s": 5.0,
            "command": "/gpu reset node3 gpu 1 --force",
            "requester_user": "alice",
        }
    )
)
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def _request(store: Store, *, now: datetime = T0, expires_in_s: float = 900) -> Approval:
    return await store.approvals.create("U1", "alice", "node3", REQUEST, expires_in_s, now=now)


async def test_a_request_is_pending_for_fifteen_minutes_by_default(store: Store) -> None:
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    assert (a.state, a.requester, a.requester_name, a.node, a.request) == (
        S.PENDING,
        "U1",
        "alice",
        "node3",
        REQUEST,
    )
    assert a.expires_at - a.created_at == timedelta(minutes=15)
    assert a.decided_by is None and a.result is None
    assert await store.approvals.get(a.id) == a
    assert await store.approvals.get(a.id + 100) is None


async def test_approve_then_execute_and_every_transition_is_audited(store: Store) -> None:
    a = await _request(store)
    ok = await store.approvals.decide(
        a.id, "U2", True, T0 + timedelta(minutes=1), approver_name="bob"
    )
    assert (ok.state, ok.decided_by, ok.decided_by_name) == (S.APPROVED, "U2", "bob")
    assert ok.decided_at == T0 + timedelta(minutes=1)
    done = await store.approvals.mark_executed(a.id, {"action_id": 7, "freed": [1]})
    assert (done.state, done.result) == (S.EXECUTED, {"action_id": 7, "freed": [1]})
    assert done.finished_at is not None
    with pytest.raises(AlreadyDecided, match="already executed"):
        await store.approvals.mark_failed(a.id, {"error": "again"})

    trail = [r.data for r in await store.records() if r.kind == "approval"]
    assert [(t["approval"], t["from"], t["to"]) for t in trail] == [
        (a.id, None, "pending"),
        (a.id, "pending", "approved"),
        (a.id, "approved", "executed"),
    ]
    assert trail[0]["plan"] == STORED and trail[2]["result"] == {"action_id": 7, "freed": [1]}
    assert (await store.verify()).ok


async def test_deny_and_a_failed_execution(store: Store) -> None:
    a, b = await _request(store), await _request(store)
    denied = await store.approvals.decide(a.id, "U2", False, T0)
    assert denied.state is S.DENIED
    with pytest.raises(AlreadyDecided, match="already denied by U2"):
        await store.approvals.mark_executed(a.id, {})
    await store.approvals.decide(b.id, "U3", True, T0)
    failed = await store.approvals.mark_failed(b.id, {"error": "node unreachable"})
    assert (failed.state, failed.result) == (S.FAILED, {"error": "node unreachable"})


async def test_nobody_approves_their_own_forced_kill(store: Store) -> None:
    a = await _request(store)
    with pytest.raises(SelfApproval, match="own"):
        await store.approvals.decide(a.id, "U1", True, T0)
    with pytest.raises(SelfApproval):
        await store.approvals.decide(a.id, "U1", False, T0)
    assert (await store.approvals.get(a.id)).state is S.PENDING  # type: ignore[union-attr]
    cancelled = await store.approvals.cancel(a.id, "U1", T0)
    assert cancelled.state is S.CANCELLED
    with pytest.raises(AlreadyDecided, match="already cancelled"):
        await store.approvals.decide(a.id, "U2", True, T0)


async def test_a_decision_after_expiry_is_refused(store: Store) -> None:
    a = await _request(store, expires_in_s=60)
    with pytest.raises(ApprovalExpired, match="expired at 12:01:00 UTC"):
        await store.approvals.decide(a.id, "U2", True, T0 + timedelta(seconds=60))
    assert (await store.approvals.get(a.id)).state is S.EXPIRED  # type: ignore[union-attr]
    with pytest.raises(AlreadyDecided, match="already expired"):
        await store.approvals.decide(a.id, "U2", True, T0 + timedelta(seconds=61))
    with pytest.raises(AlreadyDecided):
        await store.approvals.mark_executed(a.id, {})


async def test_expire_due_expires_only_what_is_due(store: Store) -> None:
    short = await _request(store, expires_in_s=30)
    long = await _request(store, expires_in_s=600)
    decided = await _request(store, expires_in_s=30)
    await store.approvals.decide(decided.id, "U2", True, T0)
    expired = await store.approvals.expire_due(T0 + timedelta(seconds=31))
    assert [(x.id, x.state) for x in expired] == [(short.id, S.EXPIRED)]
    assert [x.id for x in await store.approvals.pending()] == [long.id]
    assert await store.approvals.expire_due(T0 + timedelta(seconds=31)) == []


async def test_expire_due_of_one_source_leaves_the_others(store: Store) -> None:
    slack = await _request(store, expires_in_s=30)  # source "chat": another front end's
    mine = await store.approvals.create(
        "console:bob", "bob", "node3", REQUEST, 30, source="console", now=T0
    )
    due = T0 + timedelta(seconds=31)
    expired = await store.approvals.expire_due(due, "console")
    assert [(x.id, x.state) for x in expired] == [(mine.id, S.EXPIRED)]
    assert [x.id for x in await store.approvals.pending()] == [slack.id]
    # the control: with no source, every due request expires
    assert [x.id for x in await store.approvals.expire_due(due)] == [slack.id]


async def test_pending_approvals_survive_a_restart(store: Store, fresh_db_url: str) -> None:
    a = await _request(store)
    await store.approvals.set_message(a.id, MessageRef("C123/1700000000.000100"))
    store.close()
    again = open_store(fresh_db_url)
    try:
        [p] = await again.approvals.pending()
        assert (p.id, p.request, p.ref) == (a.id, REQUEST, "C123/1700000000.000100")
        assert (await again.approvals.decide(a.id, "U2", True, T0)).state is S.APPROVED
    finally:
        again.close()


async def test_unknown_approvals_and_bad_expiry_are_refused(store: Store) -> None:
    for attempt in (
        store.approvals.decide(999, "U2", True, T0),
        store.approvals.mark_executed(999, {}),
        store.approvals.set_message(999, MessageRef("C1/1.2")),
    ):
        with pytest.raises(ApprovalError, match="no approval 999"):
            await attempt
    a = await _request(store)
    with pytest.raises(ApprovalError, match="still pending"):
        await store.approvals.mark_executed(a.id, {})
    with pytest.raises(ApprovalError, match="future"):
        await _request(store, expires_in_s=0)


def _race(
    url: str, n: int, attempt: Callable[[Store, int], Coroutine[Any, Any, Approval]]
) -> list[Approval | GpubotError]:
    """Run ``attempt`` in ``n`` threads at once, each through its own store (own engine)."""
    stores = [open_store(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list[Approval | GpubotError] = [GpubotError("did not run")] * n

    def worker(i: int) -> None:
        async def go() -> Approval:
            barrier.wait()
            return await attempt(stores[i], i)

        try:
            results[i] = asyncio.run(go())
        except GpubotError as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    return results


async def test_concurrent_decisions_execute_exactly_once(store: Store, fresh_db_url: str) -> None:
    a = await _request(store)
    # Six approvers click at once, half approving and half denying, two of them twice.
    who = ["U2", "U3", "U4", "U2", "U5", "U3"]
    results = await asyncio.to_thread(
        _race,
        fresh_db_url,
        6,
        lambda s, i: s.approvals.decide(a.id, who[i], i % 2 == 0, T0, approver_name=who[i]),
    )
    wins = [r for r in results if isinstance(r, Approval)]
    assert len(wins) == 1, results
    assert all(isinstance(r, AlreadyDecided) for r in results if r is not wins[0]), results
    final = await store.approvals.get(a.id)
    assert final is not None and (final.state, final.decided_by) == (
        wins[0].state,
        wins[0].decided_by,
    )
    trail = [r.data["to"] for r in await store.records() if r.kind == "approval"]
    assert trail.count("approved") + trail.count("denied") == 1

    b = await _request(store)
    await store.approvals.decide(b.id, "U2", True, T0)
    results = await asyncio.to_thread(
        _race, fresh_db_url, 4, lambda s, i: s.approvals.mark_executed(b.id, {"by": i})
    )
    assert sum(isinstance(r, Approval) for r in results) == 1, results
    assert sum(isinstance(r, AlreadyDecided) for r in results) == 3, results
    trail = [r.data["to"] for r in await store.records() if r.kind == "approval"]
    assert trail.count("executed") == 1
    assert (await store.verify()).ok


async def test_concurrent_approvals_of_one_approver_execute_once(
    store: Store, fresh_db_url: str
) -> None:
    a = await _request(store)
    results = await asyncio.to_thread(
        _race, fresh_db_url, 4, lambda s, i: s.approvals.decide(a.id, "U2", True, T0)
    )
    assert sum(isinstance(r, Approval) for r in results) == 1, results
    assert sum(isinstance(r, AlreadyDecided) for r in results) == 3, results
