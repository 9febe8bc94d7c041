"""Alembic environment: ``gpubot db upgrade`` runs it with gpubot's own connection.

The bare ``alembic`` command works too, for writing new revisions: with an ini file holding
``[alembic] script_location = migrations``, run
``alembic -c that.ini -x url=sqlite:///dev.db revision --autogenerate -m "what changed"``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gpubot.store.engine import make_engine, write_tx
from gpubot.store.tables import metadata

config = context.config


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )


def run_offline() -> None:
    """Print the SQL instead of running it."""
    _configure(url=context.get_x_argument(as_dictionary=True).get("url", "sqlite://"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run against gpubot's connection, or one made from ``-x url=...``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///gpubot.db")
    with write_tx(make_engine(url)) as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
