"""Interrupted actions in the store, on SQLite and PostgreSQL: one indexed query finds the
intents without an outcome or a review; a review is a record of the chain, refused for an
action that finished or was reviewed already."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpubot.errors import StoreError, UsageError
from gpubot.store import Store, audit, open_store
from gpubot.store.tables import audit_log


async def _begin(store: Store, node: str) -> int:
    return await store.begin_action(
        kind="reset",
        actor="U0ALICE",
        source="slack",
        command=f"/gpu reset {node} gpu 1",
        node=node,
        gpus=[1],
        plan={"targets": []},
    )


async def test_only_unfinished_unreviewed_actions_on_the_nodes_asked(
    store: Store, fresh_db_url: str
) -> None:
    writer = open_store(fresh_db_url)  # the process that began them (and died)
    try:
        ids = await _record(writer)
    finally:
        writer.close()
    await _check_listed_and_reviewed(store, *ids)


async def _record(store: Store) -> tuple[int, int, int]:
    done = await _begin(store, "node1")
    await store.record_event(done, {"type": "signal", "pid": 1, "signal": "SIGTERM"})
    await store.finish_action(done, status="freed", result={})
    cut1 = await _begin(store, "node1")
    await store.record_event(cut1, {"type": "signal", "pid": 2, "signal": "SIGTERM"})
    cut2 = await _begin(store, "node2")
    await store.record_query(
        kind="status", actor="x", source="cli", nodes=["node1"], failed={}, seconds=0.1
    )
    return done, cut1, cut2


async def _check_listed_and_reviewed(store: Store, done: int, cut1: int, cut2: int) -> None:
    assert [a.id for a in await store.actions()] == [cut2, cut1, done]

    assert [a.id for a in await store.interrupted(["node1"])] == [cut1]
    assert [a.id for a in await store.interrupted(["node1", "node2"])] == [cut2, cut1]
    assert [a.id for a in await store.interrupted()] == [cut2, cut1]
    assert await store.interrupted(["node3"]) == [] and await store.interrupted([]) == []
    (one,) = await store.interrupted(["node2"])
    assert (one.kind, one.node, one.actor, one.status) == (
        "reset",
        "node2",
        "U0ALICE",
        "incomplete",
    )

    rec = await store.review_action(cut1, actor="cli:root", source="cli", note="node1 checked")
    assert (rec.kind, rec.action_id, rec.node, rec.actor) == ("review", cut1, "node1", "cli:root")
    assert rec.data == {"reviewed": cut1, "action": "reset", "note": "node1 checked"}
    assert await store.interrupted(["node1"]) == []
    assert [a.id for a in await store.incomplete_actions()] == [cut2]  # serve's report too
    detail = await store.action(cut1)
    assert detail is not None and detail.summary.status == "incomplete"  # still no outcome
    assert (await store.verify()).ok  # the review is a record of the chain like any other

    with pytest.raises(UsageError, match=f"action {cut1} was marked reviewed already, by cli:root"):
        await store.review_action(cut1, actor="U0CAROL", source="slack")
    with pytest.raises(UsageError, match=f"action {done} finished \\(freed\\)"):
        await store.review_action(done, actor="U0CAROL", source="slack")
    with pytest.raises(StoreError, match="no action 9999 in the audit log"):
        await store.review_action(9999, actor="U0CAROL", source="slack")
    reviews = [r for r in await store.records() if r.kind == "review"]
    assert len(reviews) == 1


def _plan(store: Store) -> str:
    query = audit.interrupted_query(["node1"])
    with store.engine.connect() as conn:
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").all()
            return "\n".join(str(r[-1]) for r in rows)
        conn.exec_driver_sql("SET enable_seqscan = off")  # a tiny table: ask what it could use
        return "\n".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {sql}").all())


async def test_the_query_reads_through_indexes_only(store: Store) -> None:
    for node in ("node1", "node2"):
        await _begin(store, node)
    plan = _plan(store)
    if store.engine.dialect.name == "sqlite":
        assert "SCAN audit_log" not in plan and "SCAN later" not in plan, plan
        # the intents of these nodes: through (kind, seq), or 0006's (node, kind, seq)
        assert "kind_seq (" in plan and "ix_audit_log_action_id" in plan, plan
    else:
        assert "Seq Scan" not in plan, plan  # on a tiny table it may pick either index
        assert "ix_audit_log_kind_seq" in plan, plan


def test_control_a_query_without_the_kind_filter_scans_the_log(store: Store) -> None:
    """The plan check can fail: a query on the source alone (no index) reads every record."""
    query = sa.select(audit_log).where(audit_log.c.source == "slack")
    with store.engine.connect() as conn:
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            plan = "\n".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
            assert "SCAN audit_log" in plan
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")
            plan = "\n".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
            assert "Seq Scan" in plan


async def test_an_action_this_process_runs_is_not_called_interrupted(
    store: Store, fresh_db_url: str
) -> None:
    running = await _begin(store, "node5")
    assert running not in [a.id for a in await store.interrupted(["node5"])]
    other = open_store(fresh_db_url)  # the store fixture's database, as another process opens it
    try:  # another process cannot tell it from a dead one: it lists it
        assert running in [a.id for a in await other.interrupted(["node5"])]
    finally:
        other.close()
    await store.finish_action(running, status="freed", result={})
    assert await store.interrupted(["node5"]) == []


async def test_an_outcome_that_could_not_be_written_leaves_it_interrupted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut = await _begin(store, "node6")

    def down(*_: object) -> None:
        raise StoreError("cannot record the outcome: connection refused")

    monkeypatch.setattr(store, "_follow", down)
    with pytest.raises(StoreError):
        await store.finish_action(cut, status="failed", result={})
    assert [a.id for a in await store.interrupted(["node6"])] == [cut]
