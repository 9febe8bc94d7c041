"""``gpubot db upgrade | current | downgrade REV``: the database schema.

Some tables hold what no one can rebuild (the audit log, approvals, claims), so while such a
record would go, ``downgrade`` asks first (or ``--yes``; without either it refuses), and dropping
audit records also needs ``--i-have-a-copy PATH``, a checked export of this very log. The records
are counted again under the downgrade's write lock: one written meanwhile stops the drop.

A person's word that PATH is a copy is not enough: the file may be an older export, another
database's, cut short, or no export at all. So it must parse as an export, link record to record
from the first, end at the log's chain head, and its hashes must recompute (a keyed log's only
with the key). It is read as a stream, twice at most, never held in memory.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpubot.app import open_app_store, settings_from
from gpubot.cli.audit import EXPORT_FIELDS
from gpubot.cli.common import agreed
from gpubot.errors import UsageError
from gpubot.store import Store
from gpubot.store.chain import GENESIS, walk
from gpubot.store.records import AuditRecord

if TYPE_CHECKING:
    from gpubot.store.drops import DropCheck

OPTION = "--i-have-a-copy"
CSV_HEADER = ",".join(EXPORT_FIELDS)
STRINGS = ("kind", "created_at", "actor", "source", "payload", "prev_hash", "hash")


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    store = open_app_store(settings_from(args.config, os.environ), os.environ, check_schema=False)
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
    if not args.yes and not agreed(f"downgrade {store.url} to {args.revision}, dropping {what}?"):
        raise UsageError("cancelled; nothing was dropped")
    return unchanged(found)


def check_copy(path: str, records: int, head: tuple[int, str], key: bytes | None) -> None:
    """Raise ``UsageError`` unless ``path`` is a whole export of the log ending at ``head``."""
    count, last = _links(path)
    again = f"export it again: gpubot audit export -o {path}"
    if count < records:
        raise UsageError(
            f"{OPTION}: {path} holds {count} of the log's {records} audit records: {again}"
        )
    if last != head:
        ends = "no record" if last is None else f"record {last[0]} ({last[1][:16]}…)"
        raise UsageError(
            f"{OPTION}: {path} ends at {ends}, the log's chain head is record {head[0]} "
            f"({head[1][:16]}…): not a copy of this log, or an old one: {again}"
        )
    result = walk(_records(path), head, lambda _hash: None, key)
    if not result.ok and not result.unverified:  # unverified: keyed, and no key here
        raise UsageError(f"{OPTION}: {path} is not intact: {result.reason}")


def _links(path: str) -> tuple[int, tuple[int, str] | None]:
    """Return how many records ``path`` holds and its last one's (seq, hash), each linked."""
    count, prev = 0, (0, GENESIS)
    for r in _records(path):
        if r.seq != prev[0] + 1 or r.prev_hash != prev[1]:
            raise UsageError(
                f"{OPTION}: {path}: record {r.seq} does not follow record {prev[0]} "
                "(the copy was edited, cut or reordered)"
            )
        count, prev = count + 1, (r.seq, r.hash)
    return count, (prev if count else None)


def _records(path: str) -> Iterator[AuditRecord]:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            first = f.readline()
            if first.rstrip("\r\n") == CSV_HEADER:
                for n, row in enumerate(csv.DictReader(f, fieldnames=EXPORT_FIELDS), 2):
                    yield _record(path, n, _from_csv(row))
                return
            for n, line in enumerate(itertools.chain([first], f), 1):
                if line.strip():
                    yield _record(path, n, _from_json(line))
    except OSError as exc:
        raise UsageError(f"{OPTION}: cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"{OPTION}: {path} is not a `gpubot audit export` file: {exc}") from None


def _from_json(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _from_csv(row: dict[str | Any, Any]) -> Any:
    """Return a csv row as its JSON twin: csv writes None as an empty cell, numbers as text."""
    if None in row or any(v is None for v in row.values()):
        return None  # a row with more or fewer cells than the header
    data: dict[str, Any] = {k: (v if v != "" else None) for k, v in row.items()}
    for k in ("seq", "action_id"):
        if isinstance(data[k], str):
            data[k] = int(data[k]) if data[k].isdigit() else data[k]
    for k in STRINGS:
        data[k] = data[k] or ""
    return data


def _record(path: str, line: int, data: Any) -> AuditRecord:
    """Return ``data`` as a record, or raise ``UsageError`` naming the line."""
    ok = (
        isinstance(data, dict)
        and set(data) == set(EXPORT_FIELDS)
        and type(data["seq"]) is int
        and (data["action_id"] is None or type(data["action_id"]) is int)
        and (data["node"] is None or isinstance(data["node"], str))
        and all(isinstance(data[k], str) for k in STRINGS)
    )
    if not ok:
        raise UsageError(
            f"{OPTION}: {path} line {line} is not a record of `gpubot audit export` (jsonl or csv)"
        )
    return AuditRecord(**data)
