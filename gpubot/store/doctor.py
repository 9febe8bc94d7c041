"""What ``gpubot doctor`` asks the database: whether it exists, its revision, whether gpubot
could write to it, and whether the audit log is keyed with gpubot's key.

A check must not change what it checks, so the doctor only reads. A missing SQLite file is
reported, never created (the doctor would leave a ``gpubot.db`` wherever it was run). An existing
one is opened ``mode=rw`` with ``PRAGMA query_only``: unlike ``mode=ro``, the last connection
still removes the ``-wal`` and ``-shm`` files that opening made. PostgreSQL sessions are ``READ
ONLY``. Whether gpubot could write is judged from permissions and privileges, never by writing.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import stat
import urllib.parse
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError

from gpubot.core.doctor.facts import DbFacts
from gpubot.errors import GpubotError, StoreError
from gpubot.store import migrate
from gpubot.store.audit import _keyed_from
from gpubot.store.engine import (
    BUSY_TIMEOUT_S,
    PG_CONNECT_ARGS,
    describe,
    guard,
    is_memory,
    make_engine,
    parse_url,
)


def database_facts(url: str, *, password: str | None, audit_key: bytes | None) -> DbFacts:
    """Return the database's facts; nothing is created or changed."""
    try:
        file = sqlite_file(url)
        if file is not None and not os.path.exists(file):
            return DbFacts(url, missing=os.path.abspath(file))
        engine = _reader(url, password, file)
    except GpubotError as exc:
        return DbFacts(url, error=str(exc))
    try:
        try:
            revision, head = migrate.current(engine), migrate.head()
        except StoreError as exc:
            return DbFacts(url, error=str(exc))
        facts = DbFacts(
            url,
            revision=revision,
            head=head,
            write_error=_write_error(engine, file, revision is not None),
            file=file,
            file_mode=_mode(file),
        )
        if revision is None:
            return facts
        keyed, why = _keyed(engine, audit_key)
        return dataclasses.replace(facts, keyed=keyed, keyed_error=why)
    finally:
        engine.dispose()


def sqlite_file(url: str) -> str | None:
    """Return the file a SQLite URL names (None: not a file: PostgreSQL, memory, a URI)."""
    if is_memory(url):
        return None
    u = parse_url(url)
    path = u.database
    if u.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if path.startswith("file:") else path


def _reader(url: str, password: str | None, file: str | None) -> Engine:
    """Return an engine whose connections cannot create the database nor write to it."""
    if file is not None:
        uri = f"file:{urllib.parse.quote(os.path.abspath(file))}?mode=rw"

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)

        engine = create_engine("sqlite://", creator=connect)
        event.listen(engine, "connect", lambda c, _r: _session(c, "PRAGMA query_only = ON"))
        return engine
    u = parse_url(url, password)
    if u.get_backend_name() != "postgresql":
        return make_engine(url)  # memory://: this process's own, gone when it ends
    with guard(f"cannot use {u.render_as_string()}"):
        engine = create_engine(u, connect_args=PG_CONNECT_ARGS)
    event.listen(
        engine,
        "connect",
        lambda c, _r: _session(c, "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"),
    )
    return engine


def _session(dbapi_connection: Any, statement: str) -> None:
    """Run ``statement`` for the whole session, outside any transaction a rollback undoes."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()
    dbapi_connection.commit()


def _write_error(engine: Engine, file: str | None, migrated: bool) -> str | None:
    """Return why gpubot could not write to the database, or None: judged without a write."""
    if file is not None:
        if not os.access(file, os.W_OK):
            return f"{file} is read-only for this account"
        folder = os.path.dirname(os.path.abspath(file))
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"cannot create files in {folder} (SQLite keeps its -wal and -shm files there)"
        return None
    if engine.dialect.name != "postgresql":
        return None
    # A standby or a read-only default refuses every write; then the role's own rights: to add
    # audit records, or (not migrated yet) to create gpubot's tables.
    right = (
        "has_table_privilege('audit_log', 'INSERT')"
        if migrated
        else "has_schema_privilege(current_schema(), 'CREATE')"
    )
    # reset_val: the server's, database's or role's default, not this session's READ ONLY.
    query = (
        "SELECT pg_is_in_recovery(), (SELECT reset_val FROM pg_settings "
        "WHERE name = 'default_transaction_read_only'), "
        f"current_user, current_schema(), {right}"
    )
    try:
        with engine.connect() as conn:
            standby, default_ro, user, schema, allowed = conn.execute(text(query)).one()
    except SQLAlchemyError as exc:
        return describe(exc)
    if standby:
        return "the server is a read-only standby (in recovery)"
    if default_ro == "on":
        return "the server's default_transaction_read_only is on"
    if not allowed:
        what = "add audit records" if migrated else f"create tables in schema {schema}"
        return f"role {user} may not {what}"
    return None


def _keyed(engine: Engine, key: bytes | None) -> tuple[bool, str | None]:
    """Return whether the log is keyed, and why this key cannot write to it (None: it can)."""
    try:
        with engine.connect() as conn:
            return _keyed_from(conn, key) is not None, None
    except StoreError as exc:  # only a keyed log refuses a key
        return True, str(exc)
    except SQLAlchemyError as exc:
        return False, f"cannot read the audit log: {describe(exc)}"


def _mode(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
