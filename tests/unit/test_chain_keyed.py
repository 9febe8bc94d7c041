"""The keyed (HMAC) chain, its marker, and the published-head check: pure, no database."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from gpubot.store.chain import (
    GENESIS,
    Chained,
    canonical_json,
    check_published,
    hash_of,
    key_id,
    marker_key_id,
    marker_payload,
    record_hash,
    walk,
)
from gpubot.store.records import AuditRecord, VerifyResult, iso

KEY = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def chain(n: int, *, keyed_from: int | None = None, key: bytes = KEY) -> list[AuditRecord]:
    """``n`` records; keyed with ``key`` from ``keyed_from`` (the marker) on."""
    out: list[AuditRecord] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        marker = seq == keyed_from
        r = AuditRecord(
            seq=seq,
            action_id=None if marker else 1,
            kind="chain" if marker else "event",
            created_at=iso(T0 + timedelta(seconds=seq)),
            actor="gpubot" if marker else "U1 (alice)",
            source="gpubot" if marker else "slack",
            node=None if marker else "node3",
            payload=canonical_json(marker_payload(key) if marker else {"step": seq}),
            prev_hash=prev,
            hash="",
        )
        keyed = keyed_from is not None and seq >= keyed_from
        r = dataclasses.replace(r, hash=hash_of(r, key if keyed else None))
        out.append(r)
        prev = r.hash
    return out


def check(records: list[AuditRecord], key: bytes | None = None) -> VerifyResult:
    by_hash = {r.hash: r.seq for r in records}
    head = (records[-1].seq, records[-1].hash) if records else (0, GENESIS)
    return walk(records, head, by_hash.get, key)


def test_golden_hmac_never_changes() -> None:
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
        KEY,
    )
    assert h == hmac.new(KEY, (GENESIS + body).encode(), hashlib.sha256).hexdigest()
    assert h == "1af59495996cb61a397122d8bbe9f9fa07960b97caa83400ae9ad97d8408c2ea"
    assert key_id(KEY) == "b16d9b75c1b8da2b"


@pytest.mark.parametrize(
    ("payload", "kid"),
    [
        (canonical_json(marker_payload(KEY)), key_id(KEY)),
        ('{"chain":"hmac-sha256","key_id":"B16D9B75C1B8DA2B"}', None),
        ('{"chain":"sha256","key_id":"b16d9b75c1b8da2b"}', None),
        ('{"chain":"hmac-sha256","key_id":"b16d9b75c1b8da2b","x":1}', None),
        ('{"chain":"hmac-sha256"}', None),
        ("[]", None),
        ("not json", None),
    ],
)
def test_marker_key_id(payload: str, kid: str | None) -> None:
    assert marker_key_id(payload) == kid


def test_a_keyed_chain_verifies_with_its_key_only() -> None:
    recs = chain(6, keyed_from=3)
    ok = check(recs, KEY)
    assert (ok.ok, ok.checked, ok.mode, ok.keyed_from) == (True, 6, "keyed", 3)
    assert ok.key_id == key_id(KEY)
    assert ok.line().startswith(f"audit log intact: 6 records, head 6:{recs[-1].hash}, keyed ")
    none = check(recs)
    assert (none.ok, none.unverified, none.checked, none.first_bad_seq) == (False, True, 2, None)
    assert none.reason == (
        f"records from 3 on are keyed (HMAC-SHA256, key id {key_id(KEY)}): "
        "set GPUBOT_AUDIT_KEY to verify them"
    )
    assert none.line().startswith("audit log not verified: records from 3 on")
    wrong = check(recs, OTHER)
    assert (wrong.ok, wrong.unverified, wrong.checked) == (False, True, 2)
    assert "another key" in wrong.reason and key_id(OTHER) in wrong.reason


def test_a_plain_chain_under_a_key_fails_unless_empty() -> None:
    assert check(chain(4)).ok
    under_key = check(chain(4), KEY)
    assert (under_key.ok, under_key.unverified, under_key.mode) == (False, True, "plain")
    assert "no record is keyed, yet GPUBOT_AUDIT_KEY is set" in under_key.reason
    assert check([], KEY).ok


@pytest.mark.parametrize("edited", [1, 2, 4, 6])
def test_recomputing_a_keyed_chain_without_the_key_is_caught(edited: int) -> None:
    """The attacker edits a record and recomputes the chain from it on, as sha256."""
    recs = chain(6, keyed_from=3)
    prev = recs[edited - 2].hash if edited > 1 else GENESIS
    for i in range(edited - 1, 6):
        r = recs[i]
        if r.seq == edited:
            r = dataclasses.replace(r, payload='{"step":0}')
        r = dataclasses.replace(r, prev_hash=prev)
        recs[i] = dataclasses.replace(r, hash=hash_of(r))
        prev = recs[i].hash
    assert check(recs).unverified  # without the key: cannot vouch for records 3 to 6
    found = check(recs, KEY)
    assert not found.ok and found.first_bad_seq == max(edited, 3)
    assert f"record {max(edited, 3)} was edited" in found.reason


def test_a_second_marker_is_refused() -> None:
    recs = chain(4, keyed_from=2)
    extra = AuditRecord(
        5,
        None,
        "chain",
        iso(T0),
        "gpubot",
        "gpubot",
        None,
        canonical_json(marker_payload(KEY)),
        recs[-1].hash,
        "",
    )
    recs.append(dataclasses.replace(extra, hash=hash_of(extra, KEY)))
    found = check(recs, KEY)
    assert (found.ok, found.first_bad_seq) == (False, 5)
    assert "second chain marker" in found.reason


def test_check_published() -> None:
    recs = chain(5)
    ok = check(recs)
    head = (5, recs[-1].hash)
    assert check_published(ok, head, recs[-1].hash, 5) == ok
    moved = check_published(ok, head, "f" * 64, 5)
    assert (moved.ok, moved.first_bad_seq) == (False, None)
    assert moved.line() == (
        f"audit log tampered: the published head 5:{recs[-1].hash[:16]}… is "
        f"not in the log: record 5 now has hash {'f' * 16}… (the log was "
        "rewritten)"
    )
    gone = check_published(ok, (9, "a" * 64), None, 5)
    assert "the log ends at record 5 (records were removed)" in str(gone.published)
    bad = check(recs[:2] + recs[3:])  # record 3 removed
    both = check_published(bad, head, recs[-1].hash, 5)
    assert both == bad  # the head is still there; the walk's finding stands
    both = check_published(bad, (5, "b" * 64), recs[-1].hash, 5)
    assert both.line().startswith("audit log tampered: the published head 5:bbbb")
    assert "; record 3 was removed (2 records intact before it)" in both.line()
