"""The hash chain: canonical JSON, record hashes, and the walk that finds tampering (pure).

A log is *plain* (sha256) or, with ``$GPUBOT_AUDIT_KEY``, *keyed* (HMAC-SHA256), so recomputing
the chain after an edit needs the key. The first keyed record is a ``chain`` marker; a log is
keyed once, with one key, and never goes back, so stripping the keyed records or rewriting them
as plain ones fails ``walk`` given the key. The key id names the key without revealing it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from gpubot.errors import StoreError
from gpubot.store.records import AuditRecord, VerifyResult, iso
from gpubot.store.seals import SealTrail

GENESIS = "0" * 64  # the prev_hash of record 1
MARKER = "chain"  # the kind of the record from which a log is keyed
KEYED = "hmac-sha256"
KEY_ID = re.compile(r"[0-9a-f]{16}")


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


@dataclasses.dataclass(frozen=True)
class Chained:
    """The fields of an audit record that its hash covers (``prev_hash`` aside)."""

    seq: int
    action_id: int | None
    kind: str
    created_at: str
    actor: str
    source: str
    node: str | None
    payload: str  # the stored text itself, so no re-serialisation can differ


def record_hash(prev_hash: str, fields: Chained, key: bytes | None = None) -> str:
    """Return the sha256 (with ``key``: HMAC-SHA256) of ``prev_hash`` + the other fields' JSON."""
    text = (prev_hash + canonical_json(dataclasses.asdict(fields))).encode("utf-8")
    if key is None:
        return hashlib.sha256(text).hexdigest()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def key_id(key: bytes) -> str:
    """Name ``key`` in 16 hex digits that do not reveal it."""
    return hmac.new(key, b"gpubot audit key id", hashlib.sha256).hexdigest()[:16]


def marker_payload(key: bytes) -> dict[str, str]:
    """Return the payload of the ``chain`` marker that starts a keyed log."""
    return {"chain": KEYED, "key_id": key_id(key)}


def marker_key_id(payload: str) -> str | None:
    """Return the key id a ``chain`` marker's payload names; None if it is no valid marker."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"chain", "key_id"} or data["chain"] != KEYED:
        return None
    kid = data["key_id"]
    return kid if isinstance(kid, str) and KEY_ID.fullmatch(kid) else None


def hash_of(record: AuditRecord, key: bytes | None = None) -> str:
    """Recompute ``record``'s hash from its stored fields (keyed with ``key``, if given)."""
    fields = Chained(*(getattr(record, f.name) for f in dataclasses.fields(Chained)))
    return record_hash(record.prev_hash, fields, key)


def walk(
    records: Iterable[AuditRecord],
    head: tuple[int, str],
    seq_of_hash: Callable[[str], int | None],
    key: bytes | None = None,
) -> VerifyResult:
    """Check ``records`` (in seq order) against each other and the chain ``head``.

    ``seq_of_hash`` tells a reordering from an edit. With ``key``, a log that holds no keyed
    record fails (its keyed records were stripped); without it, a keyed log cannot be verified.
    """
    w = _Walk(head[0], seq_of_hash, key)
    for r in records:
        found = w.step(r)
        if found is not None:
            return found
    return w.finish(head)


class _Walk:
    """The state of one walk: the last intact record and the chain's mode so far."""

    def __init__(
        self, head_seq: int, seq_of_hash: Callable[[str], int | None], key: bytes | None
    ) -> None:
        self.head_seq, self.seq_of_hash, self.key = head_seq, seq_of_hash, key
        self.prev_seq, self.prev_hash = 0, GENESIS
        self.before_prev = GENESIS  # the hash before prev_hash, for when the previous is bad
        self.checked = 0
        self.keyed_from: int | None = None  # the chain marker's seq, once walked past it
        self.log_key_id: str | None = None  # the key id it names
        self.trail = SealTrail(seq_of_hash)  # the seals walked (``store.seals``)

    def verdict(
        self,
        ok: bool,
        reason: str,
        bad: int | None,
        *,
        unverified: bool = False,
        mode: str | None = None,
        kid: str | None = None,
    ) -> VerifyResult:
        """Return a result that ends the walk after the last intact record."""
        broken = () if self.trail.broken is None else (self.trail.broken,)
        return VerifyResult(
            ok and not broken,
            self.checked,
            bad,
            reason,
            self.prev_hash,
            head_seq=self.prev_seq,
            mode=mode or ("plain" if self.keyed_from is None else "keyed"),
            keyed_from=self.keyed_from,
            key_id=kid or self.log_key_id,
            unverified=unverified,
            seal=self.trail.newest,
            seals=self.trail.count,
            end=broken,
            end_tampered=bool(broken),
        )

    def bad(self, seq: int, reason: str) -> VerifyResult:
        return self.verdict(False, reason, seq)

    def prev_bad(self, reason: str) -> VerifyResult:
        """The record before the current one is not intact, after all."""
        return dataclasses.replace(
            self.bad(self.prev_seq, reason),
            checked=self.checked - 1,
            head_hash=self.before_prev,
            head_seq=self.prev_seq - 1,
        )

    def step(self, r: AuditRecord) -> VerifyResult | None:
        """Check one record; return the verdict if the walk ends here."""
        if r.seq > self.head_seq:  # walked in one snapshot, so not a concurrent append
            return self.bad(
                r.seq,
                f"record {r.seq} was added behind gpubot's back "
                f"(the chain head is at {self.head_seq})",
            )
        expected = self.prev_seq + 1
        if r.seq != expected:
            if r.seq == expected + 1:
                return self.bad(expected, f"record {expected} was removed")
            return self.bad(expected, f"records {expected} to {r.seq - 1} were removed")
        key = self.key if self.keyed_from is not None else None
        kid: str | None = None
        if r.kind == MARKER:
            if self.keyed_from is not None:
                return self.bad(
                    r.seq,
                    f"record {r.seq} is a second chain marker "
                    f"(the log is keyed from record {self.keyed_from})",
                )
            kid = marker_key_id(r.payload)
            if kid is None:
                return self.bad(r.seq, f"record {r.seq} is a chain marker that names no key")
            key = self.key
        checkable = kid is None or (self.key is not None and key_id(self.key) == kid)
        if r.prev_hash != self.prev_hash:
            other = self.seq_of_hash(r.prev_hash)
            if other is not None and other != self.prev_seq:
                return self.bad(
                    r.seq, f"record {r.seq} is out of order: it was written after {other}"
                )
            if checkable and hash_of(r, key) == r.hash and self.prev_seq > 0:
                return self.prev_bad(
                    f"record {self.prev_seq} was rewritten: record {r.seq} links to another hash"
                )
            return self.bad(
                r.seq, f"record {r.seq} was edited: its link to the record before is wrong"
            )
        if kid is not None and not checkable:
            reason = self._no_key(r.seq, kid)
            return self.verdict(False, reason, None, unverified=True, mode="keyed", kid=kid)
        if hash_of(r, key) != r.hash:
            return self.bad(
                r.seq, f"record {r.seq} was edited: its content does not match its hash"
            )
        if kid is not None:
            self.keyed_from, self.log_key_id = r.seq, kid
        bad_seal = self.trail.see(r, keyed=self.keyed_from is not None and kid is None)
        if bad_seal is not None:
            return self.bad(r.seq, bad_seal)
        self.before_prev, self.prev_seq, self.prev_hash = self.prev_hash, r.seq, r.hash
        self.checked += 1
        return None

    def _no_key(self, seq: int, kid: str) -> str:
        if self.key is None:
            return (
                f"records from {seq} on are keyed (HMAC-SHA256, key id {kid}): "
                "set GPUBOT_AUDIT_KEY to verify them"
            )
        return (
            f"record {seq} keys the log with another key (key id {kid}; GPUBOT_AUDIT_KEY has "
            f"key id {key_id(self.key)}): the wrong key, or record {seq} was edited"
        )

    def finish(self, head: tuple[int, str]) -> VerifyResult:
        """Check the walked records against the chain head; return the verdict."""
        head_seq, head_hash = head
        if head_seq > self.prev_seq:
            first = self.prev_seq + 1
            what = f"records {first} to {head_seq} were"
            if first == head_seq:
                what = f"record {first} was"
            return self.bad(first, f"{what} removed from the end (the chain head is at {head_seq})")
        if head_hash != self.prev_hash:
            if self.prev_seq == 0:
                return self.bad(0, "the chain head was edited: it holds a hash with no record")
            return self.prev_bad(
                f"record {self.prev_seq} was rewritten: the chain head holds another hash"
            )
        if self.key is not None and self.keyed_from is None and self.checked > 0:
            return self.verdict(
                False,
                f"no record is keyed, yet GPUBOT_AUDIT_KEY is set (key id {key_id(self.key)}): "
                "the log was written without the key, or rewritten without it",
                None,
                unverified=True,
            )
        return self.verdict(True, f"{self.checked} records intact", None)


def check_published(
    result: VerifyResult, published: tuple[int, str], found: str | None, head_seq: int
) -> VerifyResult:
    """Add to ``result`` whether the log holds the ``published`` head (seq, hash)."""
    seq, digest = published
    if found == digest:
        return result
    said = f"the published head {seq}:{digest[:16]}… is not in the log"
    if found is not None:
        why = f"{said}: record {seq} now has hash {found[:16]}… (the log was rewritten)"
    elif seq > head_seq:
        why = f"{said}: the log ends at record {head_seq} (records were removed)"
    else:
        why = f"{said}: record {seq} is missing"
    return dataclasses.replace(result, ok=False, published=why)
