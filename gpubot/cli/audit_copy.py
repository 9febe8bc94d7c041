"""``db downgrade --i-have-a-copy PATH``: check that PATH is a whole ``gpubot audit export`` of
the log about to be dropped, before a single record is.

A person's word is not enough: the file may be an older export, another database's, cut short,
or no export at all. So it must parse as an export, link record to record from the first, end at
the log's chain head, and its hashes must recompute (a keyed log's only with the key). It is
read as a stream, twice at most, never held in memory.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator
from typing import Any

from gpubot.cli.audit import EXPORT_FIELDS
from gpubot.errors import UsageError
from gpubot.store.chain import GENESIS, walk
from gpubot.store.records import AuditRecord

OPTION = "--i-have-a-copy"
CSV_HEADER = ",".join(EXPORT_FIELDS)
STRINGS = ("kind", "created_at", "actor", "source", "payload", "prev_hash", "hash")


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
    """Yield the records of the export at ``path``, in file order."""
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
