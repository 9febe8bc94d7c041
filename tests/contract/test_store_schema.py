"""Migrations, schema checks and failing closed, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpubot.core.alerting import Intent, MessageRef
from gpubot.errors import DatabaseBehind, StoreError
from gpubot.store import open_store
from gpubot.store.tables import metadata
from gpubot.store.version import HEAD
from tests.fixtures.db import raw_engine

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "alembic_version",
    "audit_log",
    "audit_head",
    "approvals",
    "alerts",
    "gpu_samples",
    "gpu_ecc",
    "outbox",
    "leases",
    "gpu_idle",
    *("gpu_usage", "gpu_usage_last", "usage_sweeps", "usage_gaps", "idle_ladder"),
    "claims",
    "claim_waits",
    "gpu_holders",
    "maint_windows",
    "dm_due",
}
# The migrations after 0006 in the order they are chained, each with the tables it adds.
GPU_HOURS = {"gpu_usage", "gpu_usage_last", "usage_sweeps", "usage_gaps", "idle_ladder"}
GPU_HOURS |= {"usage_digests"}
CHAIN_AFTER_0006: tuple[tuple[str, frozenset[str]], ...] = (
    ("0007", frozenset({"approval_posts"})),
    ("0008", frozenset({"gpu_ecc"})),
    ("0009", frozenset(GPU_HOURS)),
    ("0010", frozenset({"claims", "claim_waits"})),
    ("0011", frozenset()),  # approvals may be ``waiting``: a new CHECK, no table
    ("0012", frozenset({"gpu_holders"})),
    ("0013", frozenset()),  # approvals get ``taken_at``: a new column, no table
)
AFTER_0006 = frozenset().union(*(tables for _, tables in CHAIN_AFTER_0006))
# 0014 folds the three outboxes into one: ``outbox`` comes, they go.
OUTBOXES = frozenset({"alert_posts", "approval_posts", "usage_digests"})
AT_0013 = TABLES - {"outbox", "maint_windows", "dm_due"} | OUTBOXES


def _tables(url: str) -> set[str]:
    engine = raw_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_go_up_from_empty_and_down_again(empty_db_url: str, db_kind: str) -> None:
    if db_kind == "postgresql":  # a new SQLite database sets itself up instead (test_store_files)
        with pytest.raises(DatabaseBehind, match=rf"base \(empty\).*needs {HEAD}.*db upgrade"):
            open_store(empty_db_url)
    store = open_store(empty_db_url, check_schema=False)
    try:
        assert store.revision() == (None, HEAD)
        store.upgrade()
        assert store.revision() == (HEAD, HEAD)
        assert _tables(empty_db_url) == TABLES
        store.upgrade()  # again: nothing to do
        store.downgrade("base")
        assert store.revision() == (None, HEAD)
        assert _tables(empty_db_url) <= {"alembic_version"}
        store.upgrade()
        assert _tables(empty_db_url) == TABLES
    finally:
        store.close()
    opened = open_store(empty_db_url)  # at head: accepted
    opened.close()


def test_0006_goes_down_and_up_again_alone(fresh_db_url: str) -> None:
    """The runs and the audit log's node index come and go with 0006; nothing else does."""
    store = open_store(fresh_db_url, check_schema=False)
    try:
        store.downgrade("0005")
        inspect = sa.inspect(store.engine)
        assert set(inspect.get_table_names()) == AT_0013 - {"gpu_idle", *AFTER_0006}
        names = {i["name"] for i in inspect.get_indexes("audit_log")}
        assert "ix_audit_log_node_kind_seq" not in names and "ix_audit_log_kind_seq" in names
        store.upgrade()
        inspect = sa.inspect(store.engine)
        assert set(inspect.get_table_names()) == TABLES
        names = {i["name"] for i in inspect.get_indexes("audit_log")}
        assert "ix_audit_log_node_kind_seq" in names
        assert store.revision() == (HEAD, HEAD)
    finally:
        store.close()


def test_each_migration_after_0006_goes_down_and_up_again_alone(fresh_db_url: str) -> None:
    """Each later migration removes exactly its own table when it is undone, in chain order."""
    store = open_store(fresh_db_url, check_schema=False)
    try:
        assert store.revision() == (HEAD, HEAD) == ("0016", "0016")
        store.downgrade("0015")  # 0016 takes its own table away, alone
        assert set(sa.inspect(store.engine).get_table_names()) == TABLES - {"dm_due"}
        store.downgrade("0014")  # and 0015
        assert set(sa.inspect(store.engine).get_table_names()) == TABLES - {
            "dm_due",
            "maint_windows",
        }
        store.downgrade("0013")
        assert set(sa.inspect(store.engine).get_table_names()) == AT_0013
        revisions = ["0006", *(rev for rev, _ in CHAIN_AFTER_0006)]
        for i in range(len(CHAIN_AFTER_0006), 0, -1):
            store.downgrade(revisions[i - 1])
            gone = set().union(*(tables for _, tables in CHAIN_AFTER_0006[i - 1 :]))
            assert set(sa.inspect(store.engine).get_table_names()) == AT_0013 - gone
        store.upgrade()
        assert set(sa.inspect(store.engine).get_table_names()) == TABLES
        assert store.revision() == (HEAD, HEAD)
    finally:
        store.close()


def test_0013_adds_taken_at_and_takes_it_away_keeping_the_state_check(fresh_db_url: str) -> None:
    """Down, ``taken_at`` goes and the rows and the CHECK on their state stay (SQLite copies the
    table); up again, it comes back empty."""
    store = open_store(fresh_db_url, check_schema=False)
    insert = (
        "INSERT INTO approvals (requester, requester_name, source, node, plan, state, "
        "created_at, expires_at) VALUES ('U1', 'alice', 'slack', 'node3', '{}', '{state}', "
        "'2030-01-01T12:00:00.000000Z', '2030-01-01T12:15:00.000000Z')"
    )

    def columns() -> set[str]:
        return {c["name"] for c in sa.inspect(store.engine).get_columns("approvals")}

    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(insert.replace("{state}", "waiting"))
        assert "taken_at" in columns()
        store.downgrade("0012")
        assert "taken_at" not in columns() and "ref" not in columns()
        with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:
            conn.exec_driver_sql(insert.replace("{state}", "bogus"))
        with store.engine.connect() as conn:
            states = conn.exec_driver_sql("SELECT state FROM approvals").scalars().all()
        assert states == ["waiting"]
        store.upgrade()
        assert "taken_at" in columns() and store.revision() == (HEAD, HEAD)
        with store.engine.connect() as conn:
            taken = conn.exec_driver_sql("SELECT taken_at FROM approvals").scalars().all()
        assert taken == [None]
    finally:
        store.close()


AT = "'2030-01-01T12:00:00.000000Z'"
ROWS_AT_0013 = (
    "INSERT INTO approvals (requester, requester_name, source, node, plan, state, created_at, "
    f"expires_at, channel, message_ts) VALUES ('U1', 'alice', 'slack', 'node3', '{{}}', "
    f"'pending', {AT}, {AT}, 'C0ONCALL', '1.5')",
    "INSERT INTO alerts (key, node, gpu, kind, holder, first_seen, last_seen, seen_count, "
    f"alerted_at, channel, message_ts) VALUES ('k1', 'node3', 2, 'orphaned-vram', '', {AT}, "
    f"{AT}, 2, {AT}, 'C1', '2.5')",
    "INSERT INTO alert_posts (token, node, keys, since, created_at, state, repeats, channel, "
    f"message_ts) VALUES ('a1', 'node3', '[\"k1\"]', {AT}, {AT}, 'posted', 0, 'C1', '2.5')",
    "INSERT INTO alert_posts (token, node, keys, since, created_at, state, repeats) VALUES "
    f"('{hashlib.sha256(b'dm:x').hexdigest()[:32]}', 'dm:x', '[]', {AT}, {AT}, 'pending', 1)",
    "INSERT INTO approval_posts (approval_id, purpose, token, channel, thread_ts, created_at, "
    f"state, repeats) VALUES (1, 'reping', 'p1', 'C0ONCALL', '1.5', {AT}, 'pending', 0)",
    "INSERT INTO usage_digests (period, token, state, created_at, channel, message_ts) VALUES "
    f"('digest:2030-01-01', 'd1', 'posted', {AT}, 'C2', '3.5')",
)


def test_0014_moves_every_outbox_row_into_one_and_back(fresh_db_url: str) -> None:
    """Up, the three outboxes' rows are the one outbox's (a once-only DM, an approval's post and
    a digest stay once-only) and every (channel, ts) is one ref; down, each comes back."""
    store = open_store(fresh_db_url, check_schema=False)
    try:
        store.downgrade("0013")
        with store.engine.begin() as conn:
            for row in ROWS_AT_0013:
                conn.exec_driver_sql(row)
        store.upgrade()
        with store.engine.connect() as conn:
            got = conn.exec_driver_sql(
                "SELECT subject, once, destination, state, repeats, ref FROM outbox ORDER BY id"
            ).all()
            refs = conn.exec_driver_sql(
                "SELECT (SELECT ref FROM alerts), (SELECT ref FROM approvals)"
            ).one()
        assert [tuple(r) for r in got] == [
            ("alert:node3", None, None, "posted", 0, "C1/2.5"),
            ("dm:x", "dm:x", None, "pending", 1, None),
            ("approval:1:reping", "approval:1:reping", "C0ONCALL/1.5", "pending", 0, None),
            ("digest:2030-01-01", "digest:2030-01-01", None, "posted", 0, "C2/3.5"),
        ]
        assert tuple(refs) == ("C1/2.5", "C0ONCALL/1.5")
        store.downgrade("0013")
        with store.engine.connect() as conn:
            back = [
                conn.exec_driver_sql(f"SELECT {cols} FROM {table}").all()
                for table, cols in (
                    ("alerts", "channel, message_ts"),
                    ("approvals", "channel, message_ts"),
                    ("alert_posts", "token, node, state, channel, message_ts"),
                    ("approval_posts", "approval_id, purpose, channel, thread_ts, state"),
                    ("usage_digests", "period, token, state, channel, message_ts"),
                )
            ]
        assert [[tuple(r) for r in rows] for rows in back] == [
            [("C1", "2.5")],
            [("C0ONCALL", "1.5")],
            [
                ("a1", "node3", "posted", "C1", "2.5"),
                (hashlib.sha256(b"dm:x").hexdigest()[:32], "dm:x", "pending", None, None),
            ],
            [(1, "reping", "C0ONCALL", "1.5", "pending")],
            [("digest:2030-01-01", "d1", "posted", "C2", "3.5")],
        ]
        store.upgrade()
        assert store.revision() == (HEAD, HEAD)
    finally:
        store.close()


async def test_0014_down_gives_once_only_rows_the_new_code_wrote_the_token_0013_finds(
    fresh_db_url: str,
) -> None:
    """0013's code finds a once-only message's row by a token made from its subject; the new
    code gives it a random one: down, the row takes the token 0013 looks for, or a hold's DM
    posted by the new code is posted again by the old."""
    store = open_store(fresh_db_url, check_schema=False)
    at, here = datetime(2030, 1, 1, 12, tzinfo=UTC), MessageRef("D9/7.7")
    try:
        tokens = {}
        for subject, once in (("dm:y", True), ("audit-head", False)):
            post = await store.outbox.begin(Intent(subject, at, once=once))
            assert post is not None and post.token != once_token(subject)
            await store.outbox.finish(post, here, at)
            tokens[subject] = post.token
        store.downgrade("0013")
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT node, token, state FROM alert_posts").all()
        by_node = {r[0]: r[1:] for r in rows}
        assert by_node["dm:y"] == (once_token("dm:y"), "posted")
        assert by_node["audit-head"] == (tokens["audit-head"], "posted")  # not once-only
        store.upgrade()
        with store.engine.connect() as conn:
            up = conn.exec_driver_sql("SELECT subject, once FROM outbox ORDER BY id").all()
        assert [tuple(r) for r in up] == [("dm:y", "dm:y"), ("audit-head", None)]
    finally:
        store.close()


def once_token(subject: str) -> str:
    return hashlib.sha256(subject.encode()).hexdigest()[:32]


def test_models_and_migrations_agree(store_url: str) -> None:
    engine = raw_engine(store_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, metadata) == []
    finally:
        engine.dispose()


def test_a_database_behind_or_unknown_is_refused(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url, check_schema=False)
    try:
        store.downgrade("base")
    finally:
        store.close()
    with pytest.raises(DatabaseBehind, match="run `gpubot db upgrade`"):
        open_store(fresh_db_url)
    engine = raw_engine(fresh_db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO alembic_version (version_num) VALUES ('9999')")
    engine.dispose()
    with pytest.raises(StoreError, match="9999, which this gpubot does not know"):
        open_store(fresh_db_url)


def test_a_downgrade_to_an_unknown_revision_is_one_line(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url, check_schema=False)
    try:
        with pytest.raises(Exception, match="cannot downgrade to 'nope'") as info:
            store.downgrade("nope")
        assert "\n" not in str(info.value)
    finally:
        store.close()


async def test_unreachable_postgresql_fails_closed(closed_port_url: str) -> None:
    store = open_store(closed_port_url, check_schema=False)
    try:
        with pytest.raises(StoreError, match=r"cannot record the intent.*(refused|failed)"):
            await store.begin_action(
                kind="reset", actor="U1", source="slack", command="x", node="n", gpus=[0], plan=None
            )
    finally:
        store.close()
    with pytest.raises(StoreError):
        open_store(closed_port_url)


CHILD = """
import asyncio, sys
from gpubot.errors import StoreError
from gpubot.store import open_store

async def main() -> int:
    store = open_store(sys.argv[1], check_schema=False)
    try:
        await store.begin_action(kind="reset", actor="U1", source="slack", command="x",
                                 node="n", gpus=[0], plan=None)
    except StoreError as exc:
        print(f"StoreError: {exc}")
        return 0
    print("recorded")
    return 1

sys.exit(asyncio.run(main()))
"""


def _without_root_override() -> list[str]:
    """Return the argv prefix that makes root respect file modes (nothing for other users)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("running as root needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def test_a_read_only_sqlite_file_fails_closed() -> None:
    # Root writes through file modes: as root, the writer runs without CAP_DAC_OVERRIDE.
    folder = Path(tempfile.mkdtemp(prefix="gpubot-ro-"))
    try:
        folder.chmod(0o777)
        url = f"sqlite:///{folder / 'audit.db'}"
        store = open_store(url, check_schema=False)
        store.upgrade()
        store.close()
        (folder / "audit.db").chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        done = subprocess.run(
            [*_without_root_override(), sys.executable, "-c", CHILD, url],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "StoreError: cannot record the intent" in done.stdout
        assert "readonly database" in done.stdout
        (folder / "audit.db").chmod(0o644)
        store = open_store(url)
        try:
            assert store.engine.dialect.name == "sqlite"
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM audit_log").scalar() == 0
        finally:
            store.close()
    finally:
        shutil.rmtree(folder)


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'g.db'}", check_schema=False)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 5000
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "words"),
    [("mysql://u@h/db", "unsupported database 'mysql'"), ("not a url", "not a database URL")],
)
def test_unsupported_urls_are_refused(url: str, words: str) -> None:
    with pytest.raises(StoreError, match=words):
        open_store(url)


def test_the_password_comes_separately_and_is_never_shown() -> None:
    store = open_store(
        "postgresql://gpubot@db.example:5432/gpubot", password="s3cret", check_schema=False
    )
    try:
        assert store.engine.url.password == "s3cret"
        assert store.engine.url.drivername == "postgresql+psycopg"
        assert "s3cret" not in store.url
    finally:
        store.close()
