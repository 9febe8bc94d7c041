"""Engines, transactions and error translation for SQLite and PostgreSQL.

Writes are serialised in the database, so that two bot replicas or a bot and the CLI never fork
the chain: PostgreSQL takes a transaction-scoped advisory lock, SQLite takes its write lock at
``BEGIN IMMEDIATE``. SQLite runs in WAL mode with a busy timeout, so readers never block.

A SQLite file holds other users' command lines: gpubot creates it ``0600`` before SQLite opens
it, and SQLite gives its ``-wal`` and ``-shm`` files the database file's mode.

``memory://`` is SQLite's ``memdb`` VFS: nothing outlasts the process, so it is for tests, demos
and trials, never an audit log. ``memory://NAME`` is shared by every engine of the process that
names it while one is open. It behaves as a SQLite file does, except that its rollback journal
is in memory, not a WAL, so a reader waits for a writer.

The audit chain's HMAC key travels with the engine as an execution option, so that every
``audit.append`` on any of its connections uses it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import sqlite3
import stat
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from sqlalchemy import Connection, Engine, Table, bindparam, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from gpubot.errors import DatabaseUnreachable, GpubotError, StoreError
from gpubot.store.outage import OUTAGE
from gpubot.store.waits import STATEMENTS, in_thread

T = TypeVar("T")
Values = dict[str, Any]  # a row's values by column name

log = logging.getLogger(__name__)

LOCK_KEY = 0x6770_7562_6F74  # "gpubot": the advisory lock every PostgreSQL write takes
BUSY_TIMEOUT_S = 15.0  # how long SQLite waits for another writer
# A server gone without closing the connection (host down, cut network) ends a blocked call:
# keepalives probe an idle connection, tcp_user_timeout bounds unacknowledged sends.
PG_CONNECT_ARGS = {
    "connect_timeout": 5,  # s: how long PostgreSQL may take to answer a connection
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
}


MEMORY = "memory://"
_MEMORY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MEMDB = "file:/gpubot-memory-"  # the memdb VFS shares a database by a name that starts with /


def memory_url(name: str | None = None) -> str:
    """Return ``memory://NAME`` (a new random name if none is given)."""
    return MEMORY + (name or secrets.token_hex(8))


def is_memory(url: str) -> bool:
    return url.startswith(MEMORY)


def parse_url(url: str, password: str | None = None) -> URL:
    """Parse a database URL, add ``password``, and choose psycopg for plain ``postgresql://``."""
    if is_memory(url):
        name = url.removeprefix(MEMORY) or secrets.token_hex(8)
        if not _MEMORY_NAME.fullmatch(name):
            raise StoreError(f"not a memory database name: {url!r} (letters, digits, _ and -)")
        return make_url(f"sqlite:///{_MEMDB}{name}?vfs=memdb&uri=true")
    try:
        u = make_url(url)
    except ArgumentError:
        raise StoreError(f"not a database URL: {url!r}") from None
    backend = u.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported database {backend!r}: use sqlite:///PATH, postgresql+psycopg://... "
            "or memory://"
        )
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
    if password is not None and backend == "postgresql":
        u = u.set(password=password)
    return u


NEW_HEAD = "gpubot_new_head"  # conn.info: (seq, hash, created_at) of the last record appended
Appended = Callable[[int, str, str], None]  # told (seq, hash, created_at) after each commit


def make_engine(
    url: str,
    password: str | None = None,
    *,
    audit_key: bytes | None = None,
    on_append: Appended | None = None,
) -> Engine:
    """Create the engine for ``url``; nothing connects until first use. ``on_append`` is told
    each new chain head after its commit, so a head it is told is in the database."""
    engine = _made(url, password)
    # Lets the loop in after a run of statements one after another (store.waits).
    event.listen(engine, "before_cursor_execute", lambda *_: STATEMENTS.before())
    event.listen(engine, "after_cursor_execute", _answered)
    options: dict[str, Any] = {}
    if audit_key is not None:
        options["gpubot_audit_key"] = audit_key
    if on_append is not None:
        options["gpubot_on_append"] = on_append
    return engine.execution_options(**options) if options else engine


def audit_key_of(conn: Connection) -> bytes | None:
    """Return the audit chain's HMAC key ``conn``'s engine was made with."""
    key = conn.get_execution_options().get("gpubot_audit_key")
    return key if isinstance(key, bytes) else None


def _answered(*_: Any) -> None:
    STATEMENTS.after()
    OUTAGE.answered()  # the database answered: an outage, if one was said, is over


def _made(url: str, password: str | None) -> Engine:
    u = parse_url(url, password)
    with guard(f"cannot use {u.render_as_string()}"):
        if u.get_backend_name() == "postgresql":
            # pool_timeout: how long a call waits for a free pooled connection
            return create_engine(
                u, pool_pre_ping=True, pool_timeout=10, connect_args=PG_CONNECT_ARGS
            )
        memory = u.database in (None, "", ":memory:")
        engine = create_engine(
            u,
            poolclass=StaticPool if memory else None,
            connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
        )
        if str(u.database).startswith(_MEMDB):
            _hold_open(engine, f"{u.database}?vfs=memdb")
    if not memory and not str(u.database).startswith("file:"):
        path = str(u.database)
        event.listen(engine, "do_connect", lambda *_: create_private(path))
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


_SCHEMA: sqlite3.Connection | None = None  # a memory database just migrated: the copy's source
_SCHEMA_LOCK = threading.Lock()


def set_up_memory(engine: Engine, upgrade: Callable[[], None]) -> None:
    """Migrate a new memory database: the process's first by ``upgrade``, each later one by
    copying the first's pages (SQLite's backup API), so a test's store skips the migrations."""
    global _SCHEMA
    with _SCHEMA_LOCK, guard("cannot set up the memory database"):
        if _SCHEMA is None:
            upgrade()
            copy = sqlite3.connect(":memory:", check_same_thread=False)
            with engine.connect() as conn:
                _raw(conn).backup(copy)
            _SCHEMA = copy
            return
        with engine.connect() as conn:
            _SCHEMA.backup(_raw(conn))


def _raw(conn: Connection) -> sqlite3.Connection:
    return cast(sqlite3.Connection, conn.connection.dbapi_connection)  # a pysqlite engine's


def _hold_open(engine: Engine, uri: str) -> None:
    """Keep the in-memory database ``uri`` alive until ``engine`` is disposed: SQLite drops a
    memdb database when its last connection closes, and a pool may close all of its own."""
    keeper = sqlite3.connect(uri, uri=True, check_same_thread=False)
    event.listen(engine, "engine_disposed", lambda _engine: keeper.close())


def create_private(path: str) -> None:
    """Create ``path`` empty and ``0600`` (whatever the umask) unless it exists; warn if public."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        _warn_if_public(path)
        return
    except OSError:
        return  # SQLite reports it (a missing folder ...) in its own words
    try:
        os.fchmod(fd, 0o600)  # the umask may have taken bits away, never added: set them all
    finally:
        os.close(fd)


def _warn_if_public(path: str) -> None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if mode & 0o077:
        log.warning(
            "%s is readable by other users (mode %04o): it holds their command lines; "
            "run `chmod 600 %s`",
            path,
            mode,
            path,
        )


def is_empty(engine: Engine) -> bool:
    """Whether a SQLite database holds no table at all (a new file): gpubot may set it up."""
    if is_postgresql(engine):
        return False
    with guard("cannot open the database"), engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar() == 0


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 module so that _sqlite_begin chooses it.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get("gpubot_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def is_postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """Open a transaction that holds the database-wide write lock until it ends."""
    with engine.connect() as conn:
        conn.execution_options(gpubot_write=True)
        conn.info.pop(NEW_HEAD, None)  # left by a write that rolled back
        with conn.begin():
            if is_postgresql(engine):
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
            yield conn
        head = conn.info.pop(NEW_HEAD, None)
    hook = engine.get_execution_options().get("gpubot_on_append")
    if head is not None and callable(hook):
        hook(*head)


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """Open a read transaction that sees one consistent snapshot."""
    with engine.connect() as conn:
        if is_postgresql(engine):
            conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def run_tx(engine: Engine, what: str, fn: Callable[[Connection], T], write: bool = False) -> T:
    """Return ``fn(conn)`` run in one read (or write) transaction, its failures mapped by
    ``guard(what)``."""
    with guard(what), (write_tx if write else read_tx)(engine) as conn:
        return fn(conn)


def write_rows(
    conn: Connection,
    table: Table,
    keys: tuple[str, ...],
    old: list[Values],
    new: list[Values],
    *,
    add: bool = False,
) -> None:
    """Update the ``old`` rows, found by their ``keys`` columns (``add``: add their other values
    to the stored ones), and insert the ``new`` ones, in two batched statements: a statement
    built per row held the store's thread too long."""
    if old:
        where = [table.c[k] == bindparam(f"k_{k}") for k in keys]
        values: Values = {}
        for c in old[0]:
            if c not in keys:
                values[c] = table.c[c] + bindparam(f"v_{c}") if add else bindparam(f"v_{c}")
        params = [{f"k_{c}" if c in keys else f"v_{c}": v for c, v in row.items()} for row in old]
        conn.execute(table.update().where(*where).values(values), params)
    if new:
        conn.execute(table.insert(), new)


class Part:
    """A part of the store over its engine; its methods are ``reads`` or ``writes``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine


P = ParamSpec("P")
S = TypeVar("S", bound=Part)
InTx = Callable[Concatenate[S, Connection, P], T]  # a method that runs in a transaction
Async = Callable[Concatenate[S, P], Coroutine[Any, Any, T]]


def reads(what: str, write: bool = False) -> Callable[[InTx[S, P, T]], Async[S, P, T]]:
    """Make a ``Part`` method async: one read (or write) transaction in the store's pool
    (``run_tx``), so the loop never waits on SQL."""

    def wrap(fn: InTx[S, P, T]) -> Async[S, P, T]:
        @functools.wraps(fn)
        async def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            def run(c: Connection) -> T:
                return fn(self, c, *args, **kwargs)

            return await in_thread(run_tx, self._engine, what, run, write)

        return call

    return wrap


def writes(what: str) -> Callable[[InTx[S, P, T]], Async[S, P, T]]:
    """``reads``, in a write transaction."""
    return reads(what, True)


def describe(exc: BaseException) -> str:
    """Return the first line of what the driver said (not installed: the extra to install)."""
    if isinstance(exc, ImportError) and exc.name in ("psycopg", "psycopg_binary"):
        return f"its driver ({exc.name}) is not installed: pip install 'gpubot[postgres]'"
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    return lines[0] if lines else type(inner).__name__


# PostgreSQL's SQLSTATEs of a server that cannot be used now: class 08 (connection exception),
# and admin shutdown, crash shutdown, cannot connect now (starting up or shutting down).
_GONE_STATES = ("57P01", "57P02", "57P03")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be reached (an outage), not that a statement
    failed; a lock timeout, a cancelled statement, a constraint or a busy file is no outage."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if not hasattr(inner, "sqlstate"):  # psycopg's errors have one; sqlite3's do not
        return False
    kinds = {k.__name__ for k in type(inner).__mro__}
    if not kinds & {"OperationalError", "InterfaceError"}:
        return False
    state = inner.sqlstate
    return state is None or state.startswith("08") or state in _GONE_STATES


@contextmanager
def guard(what: str) -> Iterator[None]:
    """Turn database failures into ``StoreError("<what>: <reason>")``: the store's one boundary
    map. An outage raises ``DatabaseUnreachable`` and tells the one outage reporter, so it is
    one line in the log, not one per caller per turn."""
    try:
        yield
    except GpubotError:
        raise
    # What the database libraries raise: SQLAlchemy's errors, the sqlite3 module's (a raw
    # connection), the files' OSError, and ImportError for a driver not installed (psycopg).
    except (SQLAlchemyError, sqlite3.Error, OSError, ImportError) as exc:
        why = f"{what}: {describe(exc)}"
        if unreachable(exc):
            OUTAGE.failed(why)
            raise DatabaseUnreachable(why) from exc
        raise StoreError(why) from exc
