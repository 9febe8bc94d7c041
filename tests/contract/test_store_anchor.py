"""Anchoring the audit log, on SQLite and PostgreSQL: an HMAC chain under ``$GPUBOT_AUDIT_KEY``
and ``verify --expect-head``, against an attacker who drops the triggers, edits a record and
recomputes every hash after it (and the chain head) as one without the key can: plain sha256."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.errors import StoreError
from gpubot.store import Store, open_store
from gpubot.store.chain import hash_of, key_id
from tests.fixtures.db import audit_rows, drop_guards, raw_engine, rewrite_chain

KEY = b"k" * 32
OTHER = b"o" * 32
EDITED = '{"action":"reset","command":"nothing happened","gpus":[],"plan":null}'


async def _records(store: Store, n_actions: int = 2) -> None:
    for i in range(n_actions):
        aid = await store.begin_action(
            kind="reset",
            actor="U1 (alice)",
            source="slack",
            command=f"/gpu reset node{i} 0",
            node=f"node{i}",
            gpus=[0],
            plan={"pids": [11]},
        )
        await store.record_event(aid, {"type": "signal", "pid": 11, "signal": "SIGTERM"})
        await store.finish_action(aid, status="ok", result={"0": "freed"})


rows = audit_rows


def rewrite(url: str, seq: int, payload: str = EDITED) -> None:
    """Edit record ``seq`` and recompute every hash after it, as sha256 (no key)."""
    rewrite_chain(url, seq, payload)


def verify_cli(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    url: str,
    *argv: str,
    key: bytes | None = None,
) -> tuple[int, str, str]:
    """Run ``gpubot audit verify ARGV`` in-process, with ``$GPUBOT_AUDIT_KEY`` = ``key``."""
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    if key is None:
        monkeypatch.delenv("GPUBOT_AUDIT_KEY", raising=False)
    else:
        monkeypatch.setenv("GPUBOT_AUDIT_KEY", key.decode())
    code = main(["--config", str(cfg), "audit", "verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_keyed_log_starts_with_its_marker_and_verifies_only_with_the_key(
    fresh_db_url: str,
) -> None:
    keyed = open_store(fresh_db_url, audit_key=KEY)
    try:
        await _records(keyed, 1)
        result = await keyed.verify()
    finally:
        keyed.close()
    recs = rows(fresh_db_url)
    assert [r.kind for r in recs] == ["chain", "intent", "event", "outcome"]
    assert recs[0].data == {"chain": "hmac-sha256", "key_id": key_id(KEY)}
    assert recs[1].action_id == 2  # its own seq, after the marker
    assert (result.ok, result.mode, result.keyed_from, result.checked) == (True, "keyed", 1, 4)
    assert hash_of(recs[-1], KEY) == recs[-1].hash != hash_of(recs[-1])

    plain = open_store(fresh_db_url)
    try:
        result = await plain.verify()
        assert (result.ok, result.unverified, result.mode) == (False, True, "keyed")
        assert "set GPUBOT_AUDIT_KEY to verify them" in result.reason
        with pytest.raises(StoreError, match=r"keyed .* set GPUBOT_AUDIT_KEY to write to it"):
            await _records(plain, 1)
    finally:
        plain.close()
    other = open_store(fresh_db_url, audit_key=OTHER)
    try:
        result = await other.verify()
        assert (result.ok, result.unverified) == (False, True)
        assert "another key" in result.reason and key_id(OTHER) in result.reason
        with pytest.raises(StoreError, match="is not the key the audit log is keyed with"):
            await _records(other, 1)
    finally:
        other.close()
    assert len(rows(fresh_db_url)) == 4  # nothing was written by either


async def test_a_plain_log_keeps_verifying_and_is_keyed_from_the_first_keyed_write(
    fresh_db_url: str,
) -> None:
    plain = open_store(fresh_db_url)
    try:
        await _records(plain, 1)
        assert (await plain.verify()).mode == "plain"
    finally:
        plain.close()
    keyed = open_store(fresh_db_url, audit_key=KEY)
    try:
        before = await keyed.verify()  # a key, but no keyed record: it may have been stripped
        assert (before.ok, before.unverified) == (False, True)
        assert "no record is keyed" in before.reason
        await _records(keyed, 1)
        after = await keyed.verify()
    finally:
        keyed.close()
    assert [r.kind for r in rows(fresh_db_url)][3:5] == ["chain", "intent"]
    assert (after.ok, after.mode, after.keyed_from, after.checked) == (True, "keyed", 4, 7)


def test_rewrite_and_recompute_of_a_plain_log_is_caught_by_the_published_head(
    store: Store,
    fresh_db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    asyncio.run(_records(store))
    published = asyncio.run(store.verify()).head
    code, out, _ = verify_cli(
        capsys, monkeypatch, tmp_path, fresh_db_url, "--expect-head", published
    )
    assert code == 0 and out.startswith(f"audit log intact: 6 records, head {published}, plain")
    rewrite(fresh_db_url, 2)
    # Without a key, a recomputed chain is consistent: only the published head tells.
    assert asyncio.run(store.verify()).ok
    code, out, err = verify_cli(
        capsys, monkeypatch, tmp_path, fresh_db_url, "--expect-head", published
    )
    assert (code, out) == (1, "")
    seq, digest = published.split(":")
    assert err == (
        f"gpubot: audit log tampered: the published head {seq}:{digest[:16]}… is not "
        f"in the log: record 6 now has hash {rows(fresh_db_url)[5].hash[:16]}… (the "
        "log was rewritten)\n"
    )


def test_rewrite_and_recompute_of_a_keyed_log_is_caught_with_the_key_and_the_head(
    fresh_db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    keyed = open_store(fresh_db_url, audit_key=KEY)
    try:
        asyncio.run(_records(keyed))
        published = asyncio.run(keyed.verify()).head
        rewrite(fresh_db_url, 3)  # an event of the first action, recomputed without the key
        result = asyncio.run(keyed.verify())
    finally:
        keyed.close()
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "record 3 was edited: its content does not match its hash" in result.reason

    def run(*argv: str, key: bytes | None) -> tuple[int, str]:
        code, out, err = verify_cli(capsys, monkeypatch, tmp_path, fresh_db_url, *argv, key=key)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
        return code, err

    code, err = run(key=KEY)
    assert code == 1 and err.startswith("gpubot: audit log tampered: record 3 was edited")
    for key in (KEY, None):
        code, err = run("--expect-head", published, key=key)
        assert code == 1 and err.startswith("gpubot: audit log tampered: the published head ")
        assert "record 7 now has hash" in err and "(the log was rewritten)" in err
    code, err = run(key=None)  # no key, no head: it cannot vouch for the log
    assert code == 1 and err.startswith(
        "gpubot: audit log not verified: records from 1 on are keyed"
    )
    code, err = run(key=OTHER)
    assert code == 1 and "another key" in err


async def test_stripping_the_keyed_records_is_caught_with_the_key(
    fresh_db_url: str, tmp_path: Path
) -> None:
    keyed = open_store(fresh_db_url, audit_key=KEY)
    try:
        await _records(keyed, 1)
    finally:
        keyed.close()
    # The attacker rewrites the log as a plain one: no marker, every hash sha256.
    engine = raw_engine(fresh_db_url)
    try:
        with engine.begin() as conn:
            drop_guards(conn)
            conn.exec_driver_sql("DELETE FROM audit_log WHERE seq = 1")
            conn.exec_driver_sql("UPDATE audit_log SET seq = seq - 1, action_id = action_id - 1")
    finally:
        engine.dispose()
    rewrite(fresh_db_url, 1, rows(fresh_db_url)[0].payload)
    plain = open_store(fresh_db_url)
    keyed = open_store(fresh_db_url, audit_key=KEY)
    try:
        assert (await plain.verify()).ok  # a consistent plain log, to one without the key
        result = await keyed.verify()
    finally:
        plain.close()
        keyed.close()
    assert not result.ok and "no record is keyed, yet GPUBOT_AUDIT_KEY is set" in result.line()


@pytest.mark.parametrize(
    ("head", "words"),
    [
        ("7", "--expect-head: expected SEQ:HASH"),
        ("0:" + "a" * 64, "--expect-head: expected SEQ:HASH"),
        ("3:abc", "--expect-head: expected SEQ:HASH"),
        ("x:" + "a" * 64, "--expect-head: expected SEQ:HASH"),
    ],
)
def test_a_bad_expected_head_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    store_url: str,
    head: str,
    words: str,
) -> None:
    code, out, err = verify_cli(capsys, monkeypatch, tmp_path, store_url, "--expect-head", head)
    assert (code, out) == (2, "") and err.count("\n") == 1 and words in err


def test_a_head_beyond_the_log_is_named(
    store: Store,
    fresh_db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    asyncio.run(_records(store))
    last = rows(fresh_db_url)[-1]
    code, _, err = verify_cli(
        capsys, monkeypatch, tmp_path, fresh_db_url, "--expect-head", f"{last.seq + 2}:{'ab' * 32}"
    )
    assert code == 1 and f"the log ends at record {last.seq} (records were removed)" in err
    # upper-case hex is the same head
    code, out, _ = verify_cli(
        capsys,
        monkeypatch,
        tmp_path,
        fresh_db_url,
        "--expect-head",
        f"{last.seq}:{last.hash.upper()}",
    )
    assert code == 0 and out.rstrip().endswith(f"holds {last.seq}:{last.hash}")


def test_a_short_key_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    store_url: str,
) -> None:
    code, out, err = verify_cli(capsys, monkeypatch, tmp_path, store_url, key=b"short")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "GPUBOT_AUDIT_KEY is set but shorter than 16 characters" in err
