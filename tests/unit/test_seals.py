"""Seals in the chain walk, their age, and the head file's format, checks and writer (pure,
or a temporary folder; no database)."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpubot.store import seals
from gpubot.store.chain import GENESIS, canonical_json, hash_of, marker_payload, walk
from gpubot.store.headfile import (
    HeadFile,
    HeadFileError,
    compare,
    make_head,
    parse_head,
)
from gpubot.store.records import AuditRecord, Seal, VerifyResult, iso
from gpubot.store.seals import SealRule, age_problem, parse_seal, seal_payload

KEY = b"0123456789abcdef0123456789abcdef"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _chain(kinds: list[str], payloads: dict[int, object] | None = None) -> list[AuditRecord]:
    """Records of ``kinds`` one minute apart, keyed from a marker when the first is "chain"."""
    out: list[AuditRecord] = []
    prev, keyed = GENESIS, False
    for seq, kind in enumerate(kinds, 1):
        keyed = keyed or kind == "chain"
        payload = (payloads or {}).get(seq, {"n": seq})
        if kind == "chain":
            payload = marker_payload(KEY)
        r = AuditRecord(
            seq,
            None,
            kind,
            iso(T0 + timedelta(minutes=seq)),
            "gpubot",
            "gpubot",
            None,
            canonical_json(payload),
            prev,
            "",
        )
        r = dataclasses.replace(r, hash=hash_of(r, KEY if keyed else None))
        out.append(r)
        prev = r.hash
    return out


def _walk(recs: list[AuditRecord]) -> VerifyResult:
    by_hash = {r.hash: r.seq for r in recs}
    return walk(recs, (recs[-1].seq, recs[-1].hash), by_hash.get, KEY)


def test_a_seal_payload_round_trips_and_stays_small() -> None:
    p = seal_payload("periodic", 900.0, (41, "a" * 64), after=None)
    text = canonical_json(p)
    assert len(text) < 120
    r = AuditRecord(42, None, "seal", iso(T0), "gpubot", "gpubot", None, text, "", "")
    assert parse_seal(r) == Seal(42, iso(T0), "periodic", 900.0, (41, "a" * 64))
    with pytest.raises(ValueError, match="not a seal reason"):
        seal_payload("later", 900.0, None)


@pytest.mark.parametrize(
    "payload",
    [
        '{"seal":"nap","every_s":900,"prev":null}',
        '{"seal":"periodic","every_s":0,"prev":null}',
        '{"seal":"periodic","every_s":true,"prev":null}',
        '{"seal":"periodic","every_s":9,"prev":[1]}',
        '{"seal":"periodic","every_s":9,"prev":[true,"x"]}',
        "[]",
        "not json",
    ],
)
def test_a_payload_that_is_no_seal(payload: str) -> None:
    r = AuditRecord(2, None, "seal", iso(T0), "gpubot", "gpubot", None, payload, "", "")
    assert parse_seal(r) is None


def test_the_walk_counts_keyed_seals_only_and_checks_their_links() -> None:
    start = seal_payload("start", 60, None)
    base = _chain(["seal", "event", "chain", "event"], {1: start})  # a plain seal: not counted
    link = (base[-1].seq, base[-1].hash)
    recs = _chain(
        ["seal", "event", "chain", "event", "seal"],
        {1: start, 5: seal_payload("periodic", 60, link)},
    )
    result = _walk(recs)
    assert result.ok and result.seals == 1
    assert result.seal is not None and (result.seal.seq, result.seal.prev) == (5, link)
    wrong = _chain(["chain", "event", "seal"], {3: seal_payload("periodic", 60, (2, "b" * 64))})
    bad = _walk(wrong)
    assert not bad.ok and bad.end_tampered
    assert "seal 3 (" in bad.line() and "names record 2 (bbbbbbbbbbbbbbbb…)" in bad.line()
    ahead = _chain(["chain", "seal"], {2: seal_payload("periodic", 60, (2, "c" * 64))})
    assert _walk(ahead).end_tampered  # a seal cannot name itself or a later record
    unreadable = _chain(["chain", "seal"], {2: {"seal": "periodic"}})
    found = _walk(unreadable)
    assert found.first_bad_seq == 2 and "a seal that cannot be read" in found.reason


def test_a_link_older_than_the_recent_window_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seals, "RECENT", 2)
    first = _chain(["chain", "event"])
    link = (2, first[-1].hash)
    recs = _chain(
        ["chain", "event", "event", "event", "event", "seal"],
        {6: seal_payload("periodic", 60, link)},
    )
    looked: list[str] = []
    by_hash = {r.hash: r.seq for r in recs}

    def seq_of_hash(h: str) -> int | None:
        looked.append(h)
        return by_hash.get(h)

    assert walk(recs, (6, recs[-1].hash), seq_of_hash, KEY).ok
    assert looked == [link[1]]


def test_age_problem() -> None:
    seal = Seal(7, iso(T0), "periodic", 900.0, None)
    assert age_problem(seal, T0 + timedelta(minutes=30), SealRule()) is None
    late = age_problem(seal, T0 + timedelta(minutes=31), SealRule())
    assert late is not None and late.startswith("the newest seal (record 7, periodic, ")
    assert "is 31 min old, more than 30 min" in late
    assert age_problem(seal, T0 + timedelta(minutes=31), SealRule(3600.0)) is None
    stop = dataclasses.replace(seal, reason="stop")
    said = age_problem(stop, T0 + timedelta(days=3), SealRule())
    assert said is not None and said.startswith("the log ends with gpubot stopping (seal 7, ")
    assert "is 3 d old" in said
    none = age_problem(None, T0, SealRule())
    assert none is not None and none.startswith("the keyed log holds no seal")


HEAD = make_head(9, "d" * 64, iso(T0), KEY)


@pytest.mark.parametrize(
    ("found", "db_seq", "words"),
    [
        ("d" * 64, 9, None),
        ("d" * 64, 12, None),
        (None, 7, "the log ends at record 7, before the head recorded outside the database"),
        ("e" * 64, 12, "record 9 is not the head recorded outside the database"),
    ],
)
def test_compare(found: str | None, db_seq: int, words: str | None) -> None:
    got = compare(HEAD, "/h", found, db_seq, KEY)
    assert (got is None) == (words is None)
    if got is not None:
        assert (
            words is not None
            and words in got[0]
            and got[1]
            and "(seq 9 at " in got[0]
            and "in /h)" in got[0]
        )


def test_compare_checks_the_mac_with_the_key() -> None:
    edited = dataclasses.replace(HEAD, seq=7)  # moved back to fit a cut, MAC left as it was
    got = compare(edited, "/h", "d" * 64, 7, KEY)
    assert got == ("the head file /h was edited: its MAC does not match the key", True)
    assert compare(edited, "/h", "d" * 64, 7, None) is None  # without the key: not checked
    bare = make_head(9, "d" * 64, iso(T0), None)
    got = compare(bare, "/h", "d" * 64, 9, KEY)
    assert got is not None and "carries no MAC, yet GPUBOT_AUDIT_KEY is set" in got[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{}", "not a gpubot head"),
        ("[1]", "not a gpubot head"),
        ('{"seq":0,"hash":"' + "a" * 64 + '","at":"t","key_id":null,"mac":null}', "seq"),
        ('{"seq":1,"hash":"xyz","at":"t","key_id":null,"mac":null}', "hash: expected 64 hex"),
        ('{"seq":1,"hash":"' + "a" * 64 + '","at":"t","key_id":"K","mac":null}', "key_id"),
    ],
)
def test_parse_head_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_head(text)


def test_the_writer_replaces_atomically_and_never_moves_back(tmp_path: Path) -> None:
    path = tmp_path / "audit.head"
    f = HeadFile(str(path), KEY)
    f.record(5, "a" * 64, iso(T0), lambda s, h: True)
    assert f.read() == make_head(5, "a" * 64, iso(T0), KEY)
    assert path.stat().st_mode & 0o777 == 0o644
    f.record(4, "b" * 64, iso(T0), lambda s, h: True)  # a slower writer's older head
    assert f.read().seq == 5
    f.record(6, "c" * 64, iso(T0), lambda s, h: True)
    assert f.read().seq == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.head", "audit.head.lock"]
    data = json.loads(path.read_text())
    assert data["key_id"] == HEAD.key_id and len(data["mac"]) == 64


def test_the_writer_keeps_a_head_the_log_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.head"
    f = HeadFile(str(path), KEY)
    f.record(9, "a" * 64, iso(T0), lambda s, h: True)
    before = path.read_bytes()
    with caplog.at_level(logging.ERROR):
        for seq in (10, 11, 12):
            f.record(seq, "b" * 64, iso(T0), lambda s, h: s != 9)
    assert path.read_bytes() == before
    [line] = [r.getMessage() for r in caplog.records]  # said once, not at every write
    assert "no longer holds the head recorded in" in line and "kept as the evidence" in line


def test_an_unreadable_head_file_is_one_line(tmp_path: Path) -> None:
    f = HeadFile(str(tmp_path / "big"), None)
    (tmp_path / "big").write_text("x" * 5000)
    with pytest.raises(HeadFileError, match="holds no gpubot head: longer than 4096 bytes"):
        f.read()
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(HeadFileError, match="holds no gpubot head"):
        HeadFile(str(tmp_path / "bin"), None).read()
