"""The audit log on SQLite and PostgreSQL: what an action records, and that records never change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gpubot.core.models import Outcome
from gpubot.errors import StoreError
from gpubot.store import Store, open_store

PLAN = {"targets": [{"pid": 4242, "start_ticks": 991, "user": "bob", "gpu": 1}], "grace_s": 10.0}


async def _reset(store: Store, *, node: str = "node3", actor: str = "U123 (alice)") -> int:
    return await store.begin_action(
        kind="reset",
        actor=actor,
        source="slack:#gpu-ops",
        command=f"/gpu reset {node} 1",
        node=node,
        gpus=[1],
        plan=PLAN,
    )


async def test_an_action_records_intent_events_and_outcome(store: Store) -> None:
    before = datetime.now(UTC)
    aid = await _reset(store)
    signal = {"type": "signal", "pid": 4242, "signal": "SIGTERM", "at": before, "result": "sent"}
    await store.record_event(aid, signal)
    gpu = {"type": "gpu", "gpu": 1, "outcome": Outcome.FREED, "before_mib": 40_000, "after_mib": 3}
    await store.record_event(aid, gpu)
    await store.finish_action(aid, status="ok", result={"gpus": {"1": Outcome.FREED}})
    after = datetime.now(UTC)

    d = await store.action(aid)
    assert d is not None
    s = d.summary
    assert (s.id, s.kind, s.actor, s.source, s.node, s.gpus, s.status) == (
        aid,
        "reset",
        "U123 (alice)",
        "slack:#gpu-ops",
        "node3",
        (1,),
        "ok",
    )
    assert s.command == "/gpu reset node3 1"
    assert before <= s.started_at <= s.finished_at <= after  # type: ignore[operator]
    assert d.plan == PLAN
    assert [e.data for e in d.events] == [
        {**signal, "at": before.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
        {**gpu, "outcome": "freed"},
    ]
    assert d.result == {"gpus": {"1": "freed"}}
    assert [r.kind for r in d.records] == ["intent", "event", "event", "outcome"]
    assert all(r.node == "node3" and r.actor == "U123 (alice)" for r in d.records)
    assert (await store.verify()).ok


async def test_an_action_without_outcome_stays_incomplete_across_restarts(
    store: Store, fresh_db_url: str
) -> None:
    done = await _reset(store)
    await store.finish_action(done, status="ok", result={})
    lost = await _reset(store, node="node4")
    await store.record_event(lost, {"type": "signal", "pid": 4242, "signal": "SIGTERM"})
    store.close()  # the bot dies between intent and outcome

    again = open_store(fresh_db_url)
    try:
        incomplete = await again.incomplete_actions()
        assert [(a.id, a.node, a.status) for a in incomplete] == [(lost, "node4", "incomplete")]
        assert incomplete[0].incomplete and incomplete[0].finished_at is None
        listed = {a.id: a.status for a in await again.actions()}
        assert listed == {done: "ok", lost: "incomplete"}
    finally:
        again.close()


async def test_an_action_is_finished_once(store: Store) -> None:
    aid = await _reset(store)
    await store.finish_action(aid, status="failed", result={"error": "node unreachable"})
    with pytest.raises(StoreError, match="finished already"):
        await store.finish_action(aid, status="ok", result={})
    with pytest.raises(StoreError, match="finished already"):
        await store.record_event(aid, {"type": "late"})
    with pytest.raises(StoreError, match="no action 999"):
        await store.record_event(999, {"type": "orphan"})
    assert (await store.action(aid)).summary.status == "failed"  # type: ignore[union-attr]
    assert await store.action(999) is None


async def test_actions_filter_by_node_actor_and_time(store: Store) -> None:
    a = await _reset(store, node="node1", actor="U1 (alice)")
    b = await _reset(store, node="node2", actor="U2 (bob)")
    c = await store.begin_action(
        kind="gpu-reset",
        actor="cli:root",
        source="cli",
        command="gpubot gpu-reset node1 0",
        node="node1",
        gpus=[0],
        plan=None,
    )
    assert [x.id for x in await store.actions()] == [c, b, a]
    assert [x.id for x in await store.actions(node="node1")] == [c, a]
    assert [x.id for x in await store.actions(actor="bob")] == [b]
    assert [x.id for x in await store.actions(actor="cli:")] == [c]
    assert [x.id for x in await store.actions(actor="%")] == []  # LIKE wildcards are literal
    assert [x.id for x in await store.actions(limit=2)] == [c, b]
    assert await store.actions(since=datetime.now(UTC) + timedelta(minutes=1)) == []
    assert len(await store.actions(since=datetime.now(UTC) - timedelta(minutes=1))) == 3
    assert (await store.action(c)).plan is None  # type: ignore[union-attr]


async def test_queries_are_recorded_briefly(store: Store) -> None:
    await store.record_query(
        kind="status",
        actor="U1 (alice)",
        source="slack:#gpu",
        nodes=["node1", "node2"],
        failed={"node2": "timed out"},
        seconds=1.23456,
    )
    await store.record_query(
        kind="sweep", actor="scheduler", source="gpubot", nodes=["node1"], failed={}, seconds=0.5
    )
    qs = await store.queries()
    assert [q.data for q in qs] == [
        {"query": "sweep", "nodes": ["node1"], "failed": {}, "seconds": 0.5},
        {
            "query": "status",
            "nodes": ["node1", "node2"],
            "failed": {"node2": "timed out"},
            "seconds": 1.235,
        },
    ]
    assert [q.node for q in qs] == ["node1", None]
    assert [q.actor for q in await store.queries(actor="alice")] == ["U1 (alice)"]
    assert await store.actions() == []  # queries are not actions


async def test_records_are_append_only_in_the_database(store: Store) -> None:
    await _reset(store)
    with store.engine.connect() as conn:
        for sql in ("UPDATE audit_log SET actor = 'U9'", "DELETE FROM audit_log"):
            with pytest.raises(sa.exc.DatabaseError, match="append-only"), conn.begin():
                conn.exec_driver_sql(sql)
    assert (await store.verify()).ok


async def test_stored_times_and_payloads_round_trip_exactly(store: Store) -> None:
    aid = await store.begin_action(
        kind="reset",
        actor="U1 (Zoë ✓)",
        source="slack",
        command="x",
        node="nœud-1",
        gpus=[0, 7],
        plan={"f": 0.1, "big": 2**62, "s": 'a\u0000b"\\'},
    )
    [rec] = await store.records()
    assert rec.action_id == aid and rec.actor == "U1 (Zoë ✓)" and rec.node == "nœud-1"
    assert rec.data["plan"] == {"f": 0.1, "big": 2**62, "s": 'a\u0000b"\\'}
    assert rec.time.tzinfo is UTC and len(rec.created_at) == 27
    assert (await store.verify()).checked == 1


async def test_values_that_cannot_be_recorded_fail_closed(store: Store) -> None:
    with pytest.raises(StoreError, match="cannot record"):
        await store.begin_action(
            kind="reset",
            actor="U1",
            source="slack",
            command="x",
            node="n",
            gpus=[0],
            plan={"x": float("nan")},
        )
    assert await store.records() == []
