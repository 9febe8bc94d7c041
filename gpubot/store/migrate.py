"""Alembic, run programmatically: no alembic.ini, the script directory found next to the code.

An installed gpubot ships the top-level ``migrations/`` folder as the package
``gpubot_migrations``; a source checkout finds it beside ``gpubot/``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine

from gpubot.errors import DatabaseBehind, StoreError, UsageError
from gpubot.store.engine import guard, write_tx

UPGRADE_HINT = "run `gpubot db upgrade`"


def migrations_dir() -> Path:
    """Return the folder holding ``env.py`` and ``versions/``."""
    spec = importlib.util.find_spec("gpubot_migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    beside = Path(__file__).resolve().parents[2] / "migrations"  # a source checkout
    env = beside / "env.py"
    if env.is_file() and "gpubot.store" in env.read_text(encoding="utf-8"):
        return beside
    raise StoreError("the database migrations are missing from this install: reinstall gpubot")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()).replace("%", "%%"))
    return cfg


def head() -> str:
    found = ScriptDirectory.from_config(_config()).get_current_head()
    if found is None:
        raise StoreError("no database migrations found")
    return found


def current(engine: Engine) -> str | None:
    with guard("cannot read the schema version"), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check(engine: Engine) -> None:
    """Raise ``DatabaseBehind`` unless the database is at this gpubot's head revision."""
    have, need = current(engine), head()
    if have == need:
        return
    known = {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}
    if have is not None and have not in known:
        raise StoreError(
            f"database is at {have}, which this gpubot does not know: a newer gpubot migrated it"
        )
    raise DatabaseBehind(
        f"database is at {have or 'base (empty)'}, this gpubot needs {need}: {UPGRADE_HINT}"
    )


def upgrade(engine: Engine, revision: str = "head") -> None:
    _run(engine, "upgrade", revision)


def downgrade(
    engine: Engine, revision: str, check: Callable[[Connection], None] | None = None
) -> None:
    """Undo migrations down to ``revision``; ``check`` runs first in the same transaction,
    under the write lock, so what it reads cannot change before the drop."""
    _run(engine, "downgrade", revision, check)


def _run(
    engine: Engine, verb: str, revision: str, check: Callable[[Connection], None] | None = None
) -> None:
    cfg = _config()
    try:
        with guard(f"cannot {verb} the database"), write_tx(engine) as conn:
            if check is not None:
                check(conn)
            cfg.attributes["connection"] = conn
            getattr(command, verb)(cfg, revision)
    except CommandError as exc:
        raise UsageError(f"cannot {verb} to {revision!r}: {exc}") from None
