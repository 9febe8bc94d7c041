"""What ``gpubot doctor`` asks the database: its revision, whether it takes a write, and
whether the audit log is keyed with the key gpubot has (``core.doctor_facts`` judges)."""

from __future__ import annotations

import dataclasses
import os
import stat

from sqlalchemy import select, text
from sqlalchemy.exc import SQLAlchemyError

from gpubot.core.doctor_facts import DbFacts
from gpubot.errors import GpubotError, StoreError
from gpubot.store import Store, migrate
from gpubot.store.audit import _keyed_from
from gpubot.store.chain import MARKER
from gpubot.store.engine import describe
from gpubot.store.tables import audit_log


def database_facts(url: str, *, password: str | None, audit_key: bytes | None) -> DbFacts:
    """Return the database's facts; nothing is changed (the write is rolled back)."""
    try:
        store = Store(url, password=password, audit_key=audit_key)
    except GpubotError as exc:
        return DbFacts(url, error=str(exc))
    try:
        try:
            revision, head = migrate.current(store.engine), migrate.head()
        except StoreError as exc:
            return DbFacts(url, error=str(exc))
        file, mode = _file_of(store)
        facts = DbFacts(
            url,
            revision=revision,
            head=head,
            write_error=_write_error(store),
            file=file,
            file_mode=mode,
        )
        if revision is None:
            return facts
        keyed, why = _keyed(store, audit_key)
        return dataclasses.replace(facts, keyed=keyed, keyed_error=why)
    finally:
        store.close()


def _write_error(store: Store) -> str | None:
    """Return why a write fails (a table created and rolled back), or None."""
    try:
        with store.engine.connect() as conn:
            tx = conn.begin()
            try:
                conn.execute(text("CREATE TABLE gpubot_doctor_probe (x INTEGER)"))
            finally:
                tx.rollback()
    except SQLAlchemyError as exc:
        return describe(exc)
    return None


def _keyed(store: Store, key: bytes | None) -> tuple[bool, str | None]:
    """Return whether the log is keyed, and why this key cannot write to it (None: it can)."""
    try:
        with store.engine.connect() as conn:
            marker = conn.execute(
                select(audit_log.c.seq).where(audit_log.c.kind == MARKER).limit(1)
            ).one_or_none()
            try:
                _keyed_from(conn, key)
            except StoreError as exc:
                return marker is not None, str(exc)
    except SQLAlchemyError as exc:
        return False, f"cannot read the audit log: {describe(exc)}"
    return marker is not None, None


def _file_of(store: Store) -> tuple[str | None, int | None]:
    """Return a SQLite database's file and its permission bits (None, None otherwise)."""
    path = store.engine.url.database
    if store.engine.dialect.name != "sqlite" or not path or path == ":memory:":
        return None, None
    try:
        return path, stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return path, None
