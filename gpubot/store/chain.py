"""The hash chain: canonical JSON, record hashes, and the walk that finds tampering (pure)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from gpubot.errors import StoreError
from gpubot.store.records import AuditRecord, VerifyResult, iso

GENESIS = "0" * 64  # the prev_hash of record 1


def _plain(value: Any) -> Any:
    """Turn the values gpubot records into JSON types (json.dumps ``default``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def canonical_json(value: Any) -> str:
    """Serialise ``value`` the one way the chain hashes it (sorted keys, no spaces, no NaN)."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_plain,
        )
    except (TypeError, ValueError) as exc:
        raise StoreError(f"cannot record a value: {exc}") from exc


def record_hash(
    prev_hash: str,
    *,
    seq: int,
    action_id: int | None,
    kind: str,
    created_at: str,
    actor: str,
    source: str,
    node: str | None,
    payload: str,
) -> str:
    """Return the sha256 hex of ``prev_hash`` + the canonical JSON of every other field."""
    body = canonical_json(
        {
            "seq": seq,
            "action_id": action_id,
            "kind": kind,
            "created_at": created_at,
            "actor": actor,
            "source": source,
            "node": node,
            "payload": payload,  # the stored text itself, so no re-serialisation can differ
        }
    )
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def hash_of(record: AuditRecord) -> str:
    """Recompute ``record``'s hash from its stored fields."""
    return record_hash(
        record.prev_hash,
        seq=record.seq,
        action_id=record.action_id,
        kind=record.kind,
        created_at=record.created_at,
        actor=record.actor,
        source=record.source,
        node=record.node,
        payload=record.payload,
    )


def walk(
    records: Iterable[AuditRecord],
    head: tuple[int, str],
    seq_of_hash: Callable[[str], int | None],
) -> VerifyResult:
    """Check ``records`` (in seq order) against each other and the chain ``head`` (seq, hash).

    ``seq_of_hash`` finds the record that carries a hash, to tell a reordering from an edit.
    """
    prev_seq, prev_hash = 0, GENESIS
    before_prev = GENESIS  # the hash before prev_hash, for when the previous record is bad
    checked = 0

    def bad(seq: int, reason: str) -> VerifyResult:
        return VerifyResult(False, checked, seq, reason, prev_hash)

    def prev_bad(reason: str) -> VerifyResult:
        return VerifyResult(False, checked - 1, prev_seq, reason, before_prev)

    head_seq, head_hash = head
    for r in records:
        if r.seq > head_seq:  # walked in one snapshot, so not a concurrent append
            return bad(
                r.seq,
                f"record {r.seq} was added behind gpubot's back (the chain head is at {head_seq})",
            )
        expected = prev_seq + 1
        if r.seq != expected:
            if r.seq == expected + 1:
                return bad(expected, f"record {expected} was removed")
            return bad(expected, f"records {expected} to {r.seq - 1} were removed")
        if r.prev_hash != prev_hash:
            other = seq_of_hash(r.prev_hash)
            if other is not None and other != prev_seq:
                return bad(r.seq, f"record {r.seq} is out of order: it was written after {other}")
            if hash_of(r) == r.hash and prev_seq > 0:
                return prev_bad(
                    f"record {prev_seq} was rewritten: record {r.seq} links to another hash"
                )
            return bad(r.seq, f"record {r.seq} was edited: its link to the record before is wrong")
        if hash_of(r) != r.hash:
            return bad(r.seq, f"record {r.seq} was edited: its content does not match its hash")
        before_prev, prev_seq, prev_hash = prev_hash, r.seq, r.hash
        checked += 1
    if head_seq > prev_seq:
        first = prev_seq + 1
        what = f"record {first} was" if first == head_seq else f"records {first} to {head_seq} were"
        return bad(first, f"{what} removed from the end (the chain head is at {head_seq})")
    if head_hash != prev_hash:
        if prev_seq == 0:
            return bad(0, "the chain head was edited: it holds a hash with no record")
        return prev_bad(f"record {prev_seq} was rewritten: the chain head holds another hash")
    return VerifyResult(True, checked, None, f"{checked} records intact", prev_hash)
