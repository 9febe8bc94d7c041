"""``store.drops`` over memory, SQLite and PostgreSQL: the rehearsal names exactly the tables a
real downgrade then drops, the protected records are counted, and a record written after they
were counted stops the drop (with its control: counted afresh, the same drop goes through)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpubot.errors import UsageError
from gpubot.store import Store, open_store
from gpubot.store.drops import at_risk, dropped_tables, unchanged
from gpubot.store.version import HEAD

STEPS = ("0009", "0006", "0003", "0001", "base")  # each below the one before


def _tables(store: Store) -> set[str]:
    return set(sa.inspect(store.engine).get_table_names()) - {"alembic_version"}


async def _reset(store: Store) -> None:
    a = await store.begin_action(
        kind="reset",
        actor="U1 (alice)",
        source="cli",
        command="gpubot reset node3 1",
        node="node3",
        gpus=[1],
        plan={"pids": [4242]},
    )
    await store.finish_action(a, status="ok", result={"1": "freed"})


def test_the_rehearsal_names_what_a_real_downgrade_drops(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url, check_schema=False)
    try:
        assert dropped_tables(store.engine, HEAD) == set()
        for rev in STEPS:
            predicted = dropped_tables(store.engine, rev)
            before = _tables(store)
            store.downgrade(rev)
            assert predicted and predicted == before - _tables(store), rev
        assert dropped_tables(store.engine, "base") == set()  # empty: nothing left to drop
    finally:
        store.close()


def test_a_revision_the_downgrade_refuses_is_refused_by_the_rehearsal(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url)
    try:
        with pytest.raises(UsageError, match="cannot downgrade to 'nope'"):
            dropped_tables(store.engine, "nope")
    finally:
        store.close()


async def test_only_protected_tables_that_go_are_counted(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url)
    try:
        await _reset(store)
        claims_only = at_risk(store.engine, "0009")
        assert claims_only.tables == ("claims", "claim_waits", "maint_windows")
        assert (claims_only.counts, claims_only.head, claims_only.describe()) == ({}, None, "")
        everything = at_risk(store.engine, "base")
        tables = ("audit_log", "approvals", "claims", "claim_waits", "maint_windows")
        assert everything.tables == tables
        assert everything.counts == {"audit_log": 2} and everything.describe() == "2 audit records"
        assert everything.head == store.last_written
    finally:
        store.close()


async def test_a_planned_maintenance_window_is_counted_before_it_is_dropped(
    fresh_db_url: str,
) -> None:
    # The window a person planned cannot be rebuilt from anything else: a downgrade below the
    # migration that made its table asks first, naming it.
    store = open_store(fresh_db_url)
    try:
        now = 1_800_000_000.0
        await store.maint.open(
            "node3", now + 3600, 7200, "firmware", by="U1 (alice)", source="cli", now=now
        )
        risk = at_risk(store.engine, "0014")
        assert risk.tables == ("maint_windows",)
        assert risk.counts == {"maint_windows": 1} and risk.describe() == "1 maintenance window"
    finally:
        store.close()


async def test_a_record_written_after_the_count_stops_the_drop(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url)
    try:
        await _reset(store)
        agreed = at_risk(store.engine, "base")
        await _reset(store)  # a bot writes while the person is being asked
        with pytest.raises(UsageError, match="changed while the downgrade was being checked"):
            store.downgrade("base", unchanged(agreed))
        assert store.revision()[0] == HEAD
        result = await store.verify()
        assert result.ok and result.checked == 4
        # Control: counted afresh, the same drop goes through.
        store.downgrade("base", unchanged(at_risk(store.engine, "base")))
        assert store.revision()[0] is None and _tables(store) == set()
    finally:
        store.close()
