"""The schema revision this gpubot needs, checked without importing Alembic.

Importing Alembic is slow and every short CLI call would pay it; the common case (at head) needs
one SELECT. Anything else falls back to ``migrate.check`` for the full diagnosis.
"""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

HEAD = "0016"  # tests/unit/test_schema_version.py keeps this equal to Alembic's head


def at_head(engine: Engine) -> bool:
    """Whether the database's recorded revision is ``HEAD`` (False on any doubt)."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    except SQLAlchemyError:
        return False
    return [r[0] for r in rows] == [HEAD]


def check(engine: Engine) -> None:
    """Raise ``DatabaseBehind`` (or ``StoreError``) unless the database is at ``HEAD``."""
    if at_head(engine):
        return
    from gpubot.store import migrate  # only when something is off: it imports Alembic

    migrate.check(engine)
