"""The hash chain: canonical JSON, record hashes and the tamper-finding walk (pure, no database)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpubot.core.findings import SMI_FAILED, FindingKey, NodeFailure
from gpubot.core.models import ApprovalState, Outcome
from gpubot.errors import StoreError
from gpubot.store.chain import GENESIS, Chained, canonical_json, hash_of, record_hash, walk
from gpubot.store.records import AuditRecord, VerifyResult, iso, parse_iso

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def make_chain(n: int) -> list[AuditRecord]:
    """Build ``n`` correctly chained records."""
    out: list[AuditRecord] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        r = AuditRecord(
            seq=seq,
            action_id=1,
            kind="intent" if seq == 1 else "event",
            created_at=iso(T0 + timedelta(seconds=seq)),
            actor="U1 (alice)",
            source="slack:#gpu",
            node="node3",
            payload=canonical_json({"step": seq, "pid": 1000 + seq}),
            prev_hash=prev,
            hash="",
        )
        out.append(_rehash(r))
        prev = out[-1].hash
    return out


def check(records: list[AuditRecord], head: tuple[int, str] | None = None) -> VerifyResult:
    """Walk ``records`` against ``head`` (default: the untouched chain's last record)."""
    by_hash = {r.hash: r.seq for r in records}
    if head is None:
        head = (records[-1].seq, records[-1].hash) if records else (0, GENESIS)
    return walk(sorted(records, key=lambda r: r.seq), head, by_hash.get)


def test_golden_hash_never_changes() -> None:
    # The hashed text is spelled out: changing the format would fail every existing log.
    body = (
        '{"action_id":1,"actor":"U1 (alice)","created_at":"2024-05-01T12:00:00.000000Z",'
        '"kind":"intent","node":"node3","payload":"{\\"a\\":1}","seq":1,"source":"slack"}'
    )
    h = record_hash(
        GENESIS,
        Chained(
            seq=1,
            action_id=1,
            kind="intent",
            created_at="2024-05-01T12:00:00.000000Z",
            actor="U1 (alice)",
            source="slack",
            node="node3",
            payload='{"a":1}',
        ),
    )
    assert h == hashlib.sha256((GENESIS + body).encode()).hexdigest()
    assert h == "e7ae2eac26a6450308c506dc01e1cda64e85bb4ecd4aaef15ff811608b4f0eaf"


def test_intact_chain_verifies() -> None:
    chain = make_chain(6)
    result = check(chain)
    assert result.ok and result.checked == 6 and result.first_bad_seq is None
    assert result.head_hash == chain[-1].hash


def test_empty_chain_verifies() -> None:
    assert check([]).ok
    assert not check([], head=(0, "f" * 64)).ok


def _edit(r: AuditRecord, **changes: object) -> AuditRecord:
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]


def _rehash(r: AuditRecord) -> AuditRecord:
    return dataclasses.replace(r, hash=hash_of(r))


Tamper = Callable[[list[AuditRecord]], list[AuditRecord]]


def _swap_seq(chain: list[AuditRecord], i: int) -> list[AuditRecord]:
    a, b = chain[i], chain[i + 1]
    chain[i], chain[i + 1] = _edit(b, seq=a.seq), _edit(a, seq=b.seq)
    return chain


def _at(i: int, change: Callable[[AuditRecord], AuditRecord]) -> Tamper:
    return lambda c: [*c[:i], change(c[i]), *c[i + 1 :]]


def _drop(*indexes: int) -> Tamper:
    return lambda c: [r for i, r in enumerate(c) if i not in indexes]


CASES: list[tuple[str, Tamper, int, str]] = [
    ("payload edited", _at(2, lambda r: _edit(r, payload='{"pid":1}')), 3, "edited"),
    ("actor edited", _at(3, lambda r: _edit(r, actor="U9 (mallory)")), 4, "edited"),
    ("time edited", _at(1, lambda r: _edit(r, created_at=iso(T0))), 2, "edited"),
    ("prev_hash edited", _at(2, lambda r: _edit(r, prev_hash="a" * 64)), 3, "edited"),
    ("hash edited", _at(2, lambda r: _edit(r, hash="b" * 64)), 3, "edited"),
    ("edited and rehashed", _at(2, lambda r: _rehash(_edit(r, node="x"))), 3, "rewritten"),
    ("first removed", _drop(0), 1, "record 1 was removed"),
    ("middle removed", _drop(2), 3, "record 3 was removed"),
    ("two removed", _drop(2, 3), 3, "records 3 to 4 were removed"),
    ("pair swapped", lambda c: _swap_seq(c, 2), 3, "out of order"),
    ("first pair swapped", lambda c: _swap_seq(c, 0), 1, "out of order"),
    ("last removed", _drop(5), 6, "removed from the end"),
    ("last rewritten", _at(5, lambda r: _rehash(_edit(r, payload="{}"))), 6, "rewritten"),
]


@pytest.mark.parametrize(("case", "tamper", "bad", "words"), CASES, ids=[c[0] for c in CASES])
def test_walk_names_the_first_bad_record(case: str, tamper: Tamper, bad: int, words: str) -> None:
    chain = make_chain(6)
    head = (chain[-1].seq, chain[-1].hash)  # the head row as gpubot last wrote it
    result = check(tamper(list(chain)), head)
    assert not result.ok
    assert result.first_bad_seq == bad, result.reason
    assert words in result.reason
    assert result.checked == bad - 1
    assert result.head_hash == (chain[bad - 2].hash if bad > 1 else GENESIS)


def test_record_added_behind_the_heads_back() -> None:
    chain = make_chain(4)
    head = (chain[2].seq, chain[2].hash)  # the head says 3 records
    result = check(chain, head)
    assert not result.ok and result.first_bad_seq == 4 and "added" in result.reason
    assert (result.checked, result.head_hash) == (3, chain[2].hash)


FIELDS = [
    "action_id",
    "kind",
    "created_at",
    "actor",
    "source",
    "node",
    "payload",
    "prev_hash",
    "hash",
]


@given(n=st.integers(1, 12), data=st.data())
def test_any_single_field_edit_is_found_at_its_record(n: int, data: st.DataObject) -> None:
    chain = make_chain(n)
    i = data.draw(st.integers(0, n - 1))
    field = data.draw(st.sampled_from(FIELDS))
    old = getattr(chain[i], field)
    if field == "action_id":
        new: object = (old or 0) + data.draw(st.integers(1, 5))
    elif field in ("prev_hash", "hash"):
        new = data.draw(
            st.text("0123456789abcdef", min_size=64, max_size=64).filter(lambda s: s != old)
        )
    else:
        new = old + data.draw(st.text(min_size=1, max_size=5))
    head = (chain[-1].seq, chain[-1].hash)
    chain[i] = _edit(chain[i], **{field: new})
    result = check(chain, head)
    assert not result.ok
    assert result.first_bad_seq == i + 1, result.reason


def test_canonical_json_is_one_text_per_value() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert canonical_json({"a": [1, 2], "b": 1}) == canonical_json({"b": 1, "a": (1, 2)})
    assert canonical_json({"n": "nœud ✓"}) == '{"n":"nœud ✓"}'
    assert canonical_json({"x": None, "f": 1.5}) == '{"f":1.5,"x":null}'


def test_canonical_json_turns_gpubot_values_into_json() -> None:
    key = FindingKey("node3", 0, "orphaned-vram")  # a named tuple: a list
    failure = NodeFailure(SMI_FAILED, "exit 9")  # a dataclass: an object
    value = {
        "outcome": Outcome.FREED,
        "state": ApprovalState.PENDING,
        "at": T0,
        "key": key,
        "failure": failure,
        "set": {3, 1, 2},
    }
    assert canonical_json(value) == (
        '{"at":"2024-05-01T12:00:00.123456Z","failure":{"kind":"smi-failed","reason":"exit 9"},'
        '"key":["node3",0,"orphaned-vram",""],"outcome":"freed","set":[1,2,3],"state":"pending"}'
    )


@pytest.mark.parametrize("bad", [{"x": math.nan}, {"x": math.inf}, {"x": object()}])
def test_canonical_json_refuses_what_cannot_round_trip(bad: object) -> None:
    with pytest.raises(StoreError, match="cannot record"):
        canonical_json(bad)


@given(
    st.datetimes(
        datetime(1970, 1, 2),
        datetime(2400, 1, 1),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7))]),
    )
)
def test_times_round_trip_exactly(moment: datetime) -> None:
    text = iso(moment)
    assert len(text) == 27 and text.endswith("Z")
    assert parse_iso(text) == moment


def test_times_sort_as_text() -> None:
    a, b = T0, T0 + timedelta(microseconds=1)
    assert iso(a) < iso(b) < iso(T0 + timedelta(days=400))


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        iso(datetime(2024, 1, 1))
