"""The audit store as the root hands it out: opened (a failure only warns, unless the store is
needed), while it opens (the cold ``gpubot status``), or the stand-in when none could be opened
(fail closed); and the node locks over it."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpubot.config import Settings, audit_key
from gpubot.core.lease import Fence
from gpubot.core.ports import AuditStore, Locks
from gpubot.errors import DatabaseBehind, StoreError

if TYPE_CHECKING:
    from gpubot.store import Store

log = logging.getLogger("gpubot.app")  # one logger for the root, whichever module


def open_app_store(
    settings: Settings, environ: Mapping[str, str], *, check_schema: bool = True
) -> Store:
    """Open the audit store (keys from ``$GPUBOT_DB_PASSWORD`` and ``$GPUBOT_AUDIT_KEY``);
    raises ``StoreError``. ``check_schema`` False: also one behind (``gpubot db`` migrates it)."""
    from gpubot.store import open_store  # SQLAlchemy: only once a store is wanted

    return open_store(
        settings.database_url,
        password=environ.get("GPUBOT_DB_PASSWORD") or None,
        audit_key=audit_key(environ),
        check_schema=check_schema,
        head_file=settings.audit.head_file,
    )


def store_or_warn(settings: Settings, environ: Mapping[str, str], need_store: bool) -> Store | None:
    """Open the store; without ``need_store`` a failure warns and returns None, except a schema
    that is behind: ``gpubot db upgrade`` fixes it once, nothing works around it each call."""
    try:
        return open_app_store(settings, environ)
    except DatabaseBehind:
        raise
    except StoreError as exc:
        if need_store:
            raise
        log.warning("audit log unavailable, this query is not recorded: %s", exc)
        return None


def locks_for(settings: Settings, store: Store | None) -> Locks:
    """With a database, leases with fencing tokens: a node's reset and the sweep are exclusive
    across replicas and processes; without, this process's locks."""
    if store is None:
        return local_locks()
    from gpubot.store.leases import DbLeases

    cfg = settings.leases
    return DbLeases(store.engine, ttl_s=cfg.ttl_s, renew_s=cfg.renew_s, now=lambda: store.clock())


@functools.cache
def local_locks() -> Locks:
    """Without a database: one registry of node locks per process."""
    from gpubot.services.locks import NodeLocks

    return NodeLocks()


class OpeningStore:
    """The audit store while ``App.run`` opens it: a write waits until it is open; none is
    made when it could not be (that was warned)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._store: AuditStore | None = None

    def opened(self, store: AuditStore | None) -> None:
        """Take the opened store (None: unusable) and let the waiting writes go."""
        self._store = store
        self._open.set()

    async def _ready(self) -> AuditStore:
        await self._open.wait()
        return self._store if self._store is not None else NoStore()

    async def record_query(self, **query: Any) -> None:
        await self._open.wait()
        if self._store is not None:  # None: "not recorded" was said when it failed to open
            await self._store.record_query(**query)

    async def begin_action(self, **action: Any) -> int:
        return await (await self._ready()).begin_action(**action)

    async def record_event(
        self, action_id: int, event: Mapping[str, Any], *, fence: Fence | None = None
    ) -> None:
        await (await self._ready()).record_event(action_id, event, fence=fence)

    async def finish_action(self, action_id: int, **outcome: Any) -> None:
        await (await self._ready()).finish_action(action_id, **outcome)


class NoStore:
    """Stands in when no store could be opened: every action is refused (fail closed)."""

    async def begin_action(self, **_: object) -> int:
        raise StoreError("the audit log is unavailable; nothing was done")

    async def record_event(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def finish_action(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def record_query(self, **_: object) -> None:
        raise StoreError("the audit log is unavailable")
