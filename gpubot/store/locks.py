"""Named locks across gpubot replicas: the sweep, and one reset per node.

PostgreSQL: a session-level advisory lock taken with ``pg_try_advisory_lock`` on a connection of
its own, held (outside any transaction) until the holder is done. If the holder's process dies
its connection closes and the server frees the lock at once, so another replica can take over.
The key is derived from the database, the schema and the name, so that replicas sharing one
schema share their locks and nothing else does. The holder is named in ``application_name``, so
a refusal can say who holds the lock and since when.

SQLite: one process is assumed; an in-process registry refuses a second holder the same way.

A lock is never waited for: ``hold`` raises ``LockHeld`` at once, like a reset already running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.pool import NullPool

from gpubot.core.timefmt import iso
from gpubot.errors import LockHeld, StoreError
from gpubot.store.engine import CONNECT_TIMEOUT_S, guard, is_postgresql

log = logging.getLogger(__name__)

LOCK_CLASS = 0x67707562  # "gpub": the first key of every named lock (two-int key space)
_LOCAL: dict[tuple[str, str], tuple[str, float]] = {}  # (database, name) -> (holder, since)
_LOCAL_GUARD = threading.Lock()


def replica_name() -> str:
    """Return this process's name among replicas: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def lock_key(database: str, schema: str, name: str) -> int:
    """Return the second advisory key of ``name`` in one database schema (31 bits)."""
    return zlib.crc32(f"{database}/{schema}/{name}".encode()) & 0x7FFFFFFF


class DbLocks:
    """Named locks held in the database (PostgreSQL) or in this process (SQLite)."""

    def __init__(self, engine: Engine, *, replica: str | None = None) -> None:
        """Use the database of ``engine`` (the store's); each lock gets a connection of its own."""
        self.replica = replica or replica_name()
        self._postgresql = is_postgresql(engine)
        self._scope = engine.url.render_as_string(hide_password=True)
        self._engine: Engine | None = None
        if self._postgresql:
            # NullPool: a released lock's connection is closed, never reused with a lock on it.
            self._engine = create_engine(
                engine.url,
                poolclass=NullPool,
                connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1,
                              "keepalives_idle": 30, "keepalives_interval": 10,
                              "keepalives_count": 3},
            )  # fmt: skip

    @asynccontextmanager
    async def hold(self, name: str, *, holder: str = "") -> AsyncIterator[None]:
        """Hold the lock ``name`` for the block, or raise ``LockHeld`` naming who holds it."""
        who = f"{self.replica} {holder}".strip()
        if self._engine is None:
            with _LocalLock(self._scope, name, who):
                yield
            return
        conn = await asyncio.to_thread(self._acquire, self._engine, name, who)
        try:
            yield
        finally:
            # Shielded: a cancelled holder still gives the lock back (closing frees it anyway).
            await asyncio.shield(asyncio.to_thread(_release, conn, name))

    def close(self) -> None:
        """Dispose of the lock engine (held locks keep their connections until released)."""
        if self._engine is not None:
            self._engine.dispose()

    def _acquire(self, engine: Engine, name: str, who: str) -> Connection:
        with guard(f"cannot take the lock {name!r}"):
            conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.execute(text("SELECT set_config('application_name', :a, false)"),
                             {"a": f"gpubot {who}"[:63]})  # fmt: skip
                db, schema = conn.execute(text("SELECT current_database(), current_schema()")).one()
                key = lock_key(str(db), str(schema or ""), name)
                got = conn.execute(
                    text("SELECT pg_try_advisory_lock(:c, :k)"), {"c": LOCK_CLASS, "k": key}
                ).scalar_one()
                if got:
                    return conn
                raise LockHeld(name, _holder(conn, key))
            except BaseException:
                conn.close()
                raise


def _holder(conn: Connection, key: int) -> str:
    """Return who holds the advisory lock ``key`` and since when, as far as the server says."""
    row = conn.execute(
        text(
            "SELECT a.application_name, a.backend_start FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :c AND l.objid = :k "
            "AND l.objsubid = 2 LIMIT 1"
        ),
        {"c": LOCK_CLASS, "k": key},
    ).one_or_none()
    if row is None:
        return "another session (gone by now)"
    app = str(row[0] or "").removeprefix("gpubot ") or "another session"
    since = row[1]
    return f"{app} since {iso(since)}" if isinstance(since, datetime) else app


def _release(conn: Connection, name: str) -> None:
    try:
        with guard(f"cannot release the lock {name!r}"):
            conn.execute(text("SELECT pg_advisory_unlock_all()"))
    except StoreError as exc:  # closing the connection below frees it all the same
        log.warning("%s", exc)
    finally:
        conn.close()


class _LocalLock:
    """Hold a name in this process's registry (SQLite: one process assumed)."""

    def __init__(self, scope: str, name: str, who: str) -> None:
        self.key = (scope, name)
        self.who = who

    def __enter__(self) -> None:
        with _LOCAL_GUARD:
            held = _LOCAL.get(self.key)
            if held is not None:
                holder, since = held
                raise LockHeld(self.key[1], f"{holder} since {iso(since)}")
            _LOCAL[self.key] = (self.who, time.time())

    def __exit__(self, *exc: Any) -> None:
        with _LOCAL_GUARD:
            _LOCAL.pop(self.key, None)
