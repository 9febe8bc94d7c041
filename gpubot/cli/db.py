"""``gpubot db upgrade | current | downgrade REV``: the database schema.

Some tables hold what no one can rebuild (the audit log, approvals, claims), so while such a
record would go, ``downgrade`` asks first (or ``--yes``; without either it refuses), and dropping
audit records also needs ``--i-have-a-copy PATH``, a checked export of this very log. The records
are counted again under the downgrade's write lock: one written meanwhile stops the drop.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpubot import config
from gpubot.app import open_app_store
from gpubot.errors import UsageError
from gpubot.store import Store

if TYPE_CHECKING:
    from gpubot.store.drops import DropCheck


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``db`` actions."""
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    sub.add_parser("upgrade", help="apply every migration this gpubot has (safe to repeat)")
    sub.add_parser("current", help="show the database's revision and the one gpubot needs")
    down = sub.add_parser("downgrade", help="undo migrations down to REV ('base' drops all)")
    down.add_argument("revision", metavar="REV")
    down.add_argument(
        "--yes",
        action="store_true",
        help="do not ask before dropping audit, approval or claim records",
    )
    down.add_argument(
        "--i-have-a-copy",
        dest="copy",
        metavar="PATH",
        help="a `gpubot audit export` of this log (checked): needed to drop audit records",
    )


def open_configured(
    config_arg: str | None, environ: Mapping[str, str], *, check_schema: bool
) -> Store:
    """Open the store the settings name, with ``$GPUBOT_DB_PASSWORD`` and ``$GPUBOT_AUDIT_KEY``."""
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
            store.downgrade(args.revision, _agreed(store, args))
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


def _agreed(store: Store, args: argparse.Namespace) -> DropCheck:
    """Return the downgrade's last check once a person has agreed to what it drops."""
    from gpubot.cli.audit_copy import OPTION, check_copy
    from gpubot.store.drops import at_risk, unchanged

    found = at_risk(store.engine, args.revision)
    what = found.describe()
    if not what:
        return unchanged(found)  # nothing kept would go; still, nothing may be written meanwhile
    missing = []
    if found.audit and args.copy is None:
        missing.append(f"{OPTION} PATH (a `gpubot audit export -o PATH` of this log)")
    tty = sys.stdin.isatty()
    if not args.yes and not tty:
        missing.append("--yes (no terminal to ask on)")
    if missing:
        raise UsageError(
            f"refusing to downgrade to {args.revision}: it would drop {what}; "
            f"to go ahead add {' and '.join(missing)}"
        )
    if found.audit:
        if found.head is None:  # records but no head: no copy can be checked against it
            raise UsageError(
                f"refusing to downgrade to {args.revision}: the audit log has no chain head; "
                "run `gpubot audit verify`"
            )
        check_copy(args.copy, found.audit, found.head, store.audit_key)
    if not args.yes:
        try:
            answer = input(f"downgrade {store.url} to {args.revision}, dropping {what}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in {"y", "yes"}:
            raise UsageError("cancelled; nothing was dropped")
    return unchanged(found)
