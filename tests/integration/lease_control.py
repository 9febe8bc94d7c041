"""The control of the lease tests: the node lock gpubot had before leases, kept here only to
show what it does across a database restart (a session-level ``pg_try_advisory_lock`` on a
connection of its own, which the server frees when that session ends)."""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.pool import NullPool

from gpubot.core.lease import Lease
from gpubot.errors import LockHeld


class AdvisoryLocks:
    """The removed ``store.locks.DbLocks``, reduced to what the control needs (PostgreSQL)."""

    def __init__(self, engine: Engine, replica: str) -> None:
        self.replica = replica
        self._engine = create_engine(engine.url, poolclass=NullPool)

    @asynccontextmanager
    async def hold(self, name: str, *, holder: str = "") -> AsyncIterator[Lease]:
        conn = await asyncio.to_thread(self._acquire, name)
        try:
            yield Lease(name, holder, 1, float("inf"), shared=False)
        finally:
            await asyncio.to_thread(_release, conn)

    def close(self) -> None:
        self._engine.dispose()

    def _acquire(self, name: str) -> Connection:
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        key = zlib.crc32(name.encode()) & 0x7FFFFFFF
        if conn.execute(text("SELECT pg_try_advisory_lock(1, :k)"), {"k": key}).scalar_one():
            return conn
        conn.close()
        raise LockHeld(name, "another session")


def _release(conn: Connection) -> None:
    with contextlib.suppress(Exception):  # after a restart the session is gone, and its lock
        conn.execute(text("SELECT pg_advisory_unlock_all()"))
    with contextlib.suppress(Exception):
        conn.close()
