"""``audit list --node X --since 1h`` reads through indexes on SQLite and PostgreSQL (EXPLAIN).

The log is filled with a few thousand records of a thousand nodes (written directly: a plan
needs rows, not a chain), PostgreSQL's statistics are taken as autovacuum would, and each
database is asked how it would run the listing's query. SQLite is asked as deployed: no
``ANALYZE``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from gpubot.store import Store
from gpubot.store.audit_list import summaries_query
from gpubot.store.records import iso
from gpubot.store.tables import audit_log

NODES = 1000
NOW = datetime(2027, 6, 1, tzinfo=UTC)


def fill(store: Store, records: int = 6000) -> None:
    rows = [
        {
            "seq": i,
            "action_id": i if i % 3 == 0 else None,
            "kind": "intent" if i % 3 == 0 else "query",
            "created_at": iso(NOW - timedelta(minutes=records - i)),
            "actor": "U1",
            "source": "slack",
            "node": f"node{i % NODES}",
            "payload": "{}",
            "prev_hash": f"{i:064x}",
            "hash": f"{i + 1:064x}",
        }
        for i in range(1, records + 1)
    ]
    with store.engine.begin() as conn:
        conn.execute(audit_log.insert(), rows)
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE audit_log")


def plan_of(store: Store, query: sa.Select[object]) -> str:
    with store.engine.connect() as conn:
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").all()
            return "\n".join(str(r[-1]) for r in rows)
        return "\n".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {sql}").all())


def listing() -> sa.Select[object]:
    return summaries_query(node="node7", since=NOW - timedelta(hours=1), limit=50)


async def test_a_node_listing_since_an_hour_reads_through_the_node_index(store: Store) -> None:
    fill(store)
    plan = plan_of(store, listing())
    assert "ix_audit_log_node_kind_seq" in plan, plan
    if store.engine.dialect.name == "sqlite":
        assert "SCAN audit_log" not in plan and "SCAN outcome" not in plan, plan
        assert "ix_audit_log_created_at" in plan, plan  # the seq bound of --since
    else:
        assert "Seq Scan" not in plan, plan
    got = await store.actions(node="node7", since=NOW - timedelta(hours=1))
    assert got == []  # node7's last intent is older than an hour
    recent = await store.actions(node="node997", since=NOW - timedelta(hours=3))
    assert [a.id for a in recent] == [5997]  # the bound cuts nothing the time filter keeps


async def test_control_without_the_index_the_node_is_a_filter(store: Store) -> None:
    """The plan check can fail: without 0006's index the node is read and filtered."""
    fill(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_audit_log_node_kind_seq")
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE audit_log")
    plan = plan_of(store, listing())
    assert "ix_audit_log_node_kind_seq" not in plan, plan
    if store.engine.dialect.name == "postgresql":
        assert "Filter" in plan and "node" in plan.split("Filter", 1)[1], plan
