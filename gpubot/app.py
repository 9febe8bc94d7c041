"""The composition root: settings → adapters → services. Entry points call ``build``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from gpubot.config import Settings, audit_key, config_path, load
from gpubot.core.ports import AuditStore, Locks, Transport
from gpubot.errors import DatabaseBehind, StoreError
from gpubot.services.reset import NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.ssh import make_transport
from gpubot.store import Store, open_store
from gpubot.store.locks import DbLocks

log = logging.getLogger(__name__)

_LOCAL_LOCKS = NodeLocks()  # without a database: one registry per process


@dataclass
class App:
    """Everything a front end needs, wired once."""

    settings: Settings
    transport: Transport
    store: Store | None
    status: StatusService
    reset: ResetService

    async def close(self) -> None:
        """Close connections and the database."""
        await self.transport.close()
        if self.store is not None:
            self.store.close()


def settings_from(cli_config: str | None, environ: Mapping[str, str]) -> Settings:
    """Load the settings file chosen by ``--config`` / ``$GPUBOT_CONFIG`` / ``./gpubot.toml``."""
    return load(config_path(cli_config, environ))


def open_app_store(settings: Settings, environ: Mapping[str, str]) -> Store:
    """Open the audit store; raises ``StoreError`` (``DatabaseBehind`` says how to fix it).

    ``$GPUBOT_DB_PASSWORD`` is the database password, ``$GPUBOT_AUDIT_KEY`` the chain's key.
    """
    return open_store(
        settings.database_url,
        password=environ.get("GPUBOT_DB_PASSWORD"),
        audit_key=audit_key(environ),
    )


def build(settings: Settings, environ: Mapping[str, str], *, need_store: bool) -> App:
    """Wire adapters and services; without ``need_store`` a database that fails only warns.

    A schema that is not set up (``DatabaseBehind``) always stops us: it is fixed once, by
    ``gpubot db upgrade``, not worked around on every call.
    """
    store: Store | None = None
    try:
        store = open_app_store(settings, environ)
    except DatabaseBehind:
        raise
    except StoreError as exc:
        if need_store:
            raise
        log.warning("audit log unavailable, this query is not recorded: %s", exc)
    transport = make_transport(settings.ssh)
    status = StatusService(settings, transport, store)
    audit: AuditStore = store if store is not None else _NoStore()
    # With a database, a node's reset is exclusive across replicas (PostgreSQL advisory locks).
    locks: Locks = DbLocks(store.engine) if store is not None else _LOCAL_LOCKS
    reset = ResetService(settings, transport, audit, status, locks)
    return App(settings, transport, store, status, reset)


class _NoStore:
    """Stands in when no store could be opened: every action is refused (fail closed)."""

    async def begin_action(self, **_: object) -> int:
        raise StoreError("the audit log is unavailable; nothing was done")

    async def record_event(self, *_: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def finish_action(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def record_query(self, **_: object) -> None:
        raise StoreError("the audit log is unavailable")
