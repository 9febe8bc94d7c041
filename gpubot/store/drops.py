"""What ``gpubot db downgrade REV`` would destroy, found before anything is dropped.

Which tables a downgrade drops is written only in the migrations, so the same downgrade is
rehearsed on an empty in-memory SQLite database at the real one's revision, and the tables that
vanish there would vanish here; a new migration is covered without editing this module. The
migrations build the same tables on SQLite and PostgreSQL, so the rehearsal holds for either.

``PROTECTED`` tables hold records a person cannot rebuild; the rest are derived or transient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, inspect, select, table

from gpubot.errors import UsageError
from gpubot.store import audit, migrate
from gpubot.store.engine import guard, make_engine, memory_url, run_tx

# table -> what one of its rows is called; the order is the order they are named in.
PROTECTED: dict[str, str] = {
    "audit_log": "audit record",  # the hash chain the whole safety story rests on
    "approvals": "approval",  # who asked for a forced kill and who allowed it
    "claims": "claim",  # who holds (held) which GPU until when
    "claim_waits": "queued claim request",  # people waiting for a GPU, first come first served
    "maint_windows": "maintenance window",  # planned work that claims and alerts respect
}
AUDIT = "audit_log"
DropCheck = Callable[[Connection], None]  # run under the downgrade's write lock (``unchanged``)


@dataclass(frozen=True)
class AtRisk:
    """The protected records a downgrade would drop, and the audit chain's head (seq, hash)
    when they were counted: a change of either between asking and dropping stops the drop."""

    tables: tuple[str, ...]  # the protected tables dropped, empty or not
    counts: dict[str, int]  # protected table -> rows, only tables dropped that hold some
    head: tuple[int, str] | None  # None: the audit chain is not dropped, or has no head

    @property
    def audit(self) -> int:
        return self.counts.get(AUDIT, 0)

    def describe(self) -> str:
        """Return what would be dropped, for a person: ``12 audit records, 1 approval``."""
        return ", ".join(
            f"{n} {PROTECTED[t]}{'' if n == 1 else 's'}" for t, n in self.counts.items()
        )


def dropped_tables(engine: Engine, revision: str) -> set[str]:
    """Return the tables that downgrading ``engine``'s database to ``revision`` would drop."""
    current = migrate.current(engine)
    if current is None:
        return set()  # an empty database: nothing to drop
    rehearsal = make_engine(memory_url())
    try:
        try:
            migrate.upgrade(rehearsal, current)
        except UsageError:
            raise UsageError(
                f"cannot downgrade to {revision!r}: the database is at {current}, "
                "which this gpubot does not know"
            ) from None
        before = _tables(rehearsal)
        migrate.downgrade(rehearsal, revision)
        return before - _tables(rehearsal)
    finally:
        rehearsal.dispose()


def at_risk(engine: Engine, revision: str) -> AtRisk:
    """Return the protected records that downgrading to ``revision`` would drop (none: empty)."""
    gone = dropped_tables(engine, revision)
    dropped = tuple(t for t in PROTECTED if t in gone)
    what = "cannot count the records a downgrade would drop"
    return run_tx(engine, what, lambda conn: snapshot(conn, dropped))


def snapshot(conn: Connection, tables: tuple[str, ...]) -> AtRisk:
    """Count the rows of ``tables`` (protected ones) and read the chain head, in ``conn``."""
    counts = {t: _count(conn, t) for t in tables}
    counts = {t: n for t, n in counts.items() if n}
    return AtRisk(tables, counts, audit.head(conn) if AUDIT in tables else None)


def unchanged(found: AtRisk) -> DropCheck:
    """Return a check for the downgrade's own transaction: the records and the chain head are
    still those a person agreed to drop (a bot may have written since they were counted)."""

    def check(conn: Connection) -> None:
        now = snapshot(conn, found.tables)
        if now != found:
            raise UsageError(
                "the database changed while the downgrade was being checked "
                f"(now: {now.describe() or 'no records'}); nothing was dropped: run it again"
            )

    return check


def _count(conn: Connection, name: str) -> int:
    return int(conn.execute(select(func.count()).select_from(table(name))).scalar_one())


def _tables(engine: Engine) -> set[str]:
    with guard("cannot rehearse the downgrade"), engine.connect() as conn:
        return set(inspect(conn).get_table_names()) - {"alembic_version"}
