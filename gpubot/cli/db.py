"""``gpubot db upgrade | current | downgrade REV``: the database schema."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from gpubot import config
from gpubot.app import open_app_store
from gpubot.store import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``db`` actions."""
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    sub.add_parser("upgrade", help="apply every migration this gpubot has (safe to repeat)")
    sub.add_parser("current", help="show the database's revision and the one gpubot needs")
    down = sub.add_parser("downgrade", help="undo migrations down to REV ('base' drops all)")
    down.add_argument("revision", metavar="REV")


def open_configured(
    config_arg: str | None, environ: Mapping[str, str], *, check_schema: bool
) -> Store:
    """Open the store named by the settings file.

    The password comes from ``$GPUBOT_DB_PASSWORD``, the audit chain's key from
    ``$GPUBOT_AUDIT_KEY``.
    """
    settings = config.load(config.config_path(config_arg, environ))
    return open_app_store(settings, environ, check_schema=check_schema)


def run(args: argparse.Namespace) -> int:
    """Run one ``db`` action; return the exit status."""
    store = open_configured(args.config, os.environ, check_schema=False)
    try:
        before, head = store.revision()
        if args.db_command == "upgrade":
            store.upgrade()
            after = store.revision()[0]
            what = "already at" if before == after else f"{before or 'base'} ->"
            print(f"{store.url}: {what} {after}")
        elif args.db_command == "downgrade":
            store.downgrade(args.revision)
            print(f"{store.url}: {before or 'base'} -> {store.revision()[0] or 'base'}")
        elif before == head:
            print(f"{store.url}: at {before} (what this gpubot needs)")
        else:
            print(
                f"{store.url}: at {before or 'base (empty)'}, this gpubot needs {head}: "
                "run `gpubot db upgrade`"
            )
        return 0
    finally:
        store.close()
