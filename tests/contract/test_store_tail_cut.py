"""Hostile case 4 of issue 21, on SQLite and PostgreSQL: the last action's records are cut off
the end of a keyed log (trigger dropped, rows deleted, ``audit_head`` moved back, trigger
restored). The chain alone says "intact … keyed" (the control); the newest seal's age, a
seal's link and the head file outside the database each catch it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpubot.store import SealRule, Store, open_store
from tests.fixtures.audit_cut import (
    EVERY_S,
    KEY,
    at,
    cut_tail,
    deletes_are_refused,
    sealed_history,
)
from tests.fixtures.db import audit_rows


def _open(url: str, head_file: Path | None = None) -> Store:
    return open_store(url, audit_key=KEY, head_file=None if head_file is None else str(head_file))


async def test_a_tail_cut_passes_the_chain_alone_but_not_the_seal_age(fresh_db_url: str) -> None:
    store = _open(fresh_db_url)
    try:
        history = await sealed_history(store)
        new_head = cut_tail(fresh_db_url, history.last_action)
        assert deletes_are_refused(fresh_db_url)  # the trigger is back, as the attacker left it
        # CONTROL: the chain alone (what verify did before seals) vouches for the cut log.
        old = await store.verify()
        assert old.ok and old.mode == "keyed" and old.head_seq == new_head[0] < history.head[0]
        assert old.line().startswith(f"audit log intact: {new_head[0]} records")
        # The defence: the newest seal left is the periodic one from 45 minutes ago.
        new = await store.verify(seals=SealRule(), now=history.now)
    finally:
        store.close()
    assert not new.ok and not new.end_tampered
    assert new.seal is not None and new.seal.reason == "periodic"
    [why] = new.end
    assert why.startswith(f"the newest seal (record {new.seal.seq}, periodic, ")
    assert (
        "is 45 min old, more than 30 min ([audit] max_seal_age): records after it were "
        "removed, or gpubot serve has not run since"
    ) in why
    assert new.line() == f"audit log not verified: {why}"


async def test_the_uncut_log_passes_the_seal_age(fresh_db_url: str) -> None:
    """The same history, not cut: the newest seal is a minute old."""
    store = _open(fresh_db_url)
    try:
        history = await sealed_history(store)
        result = await store.verify(seals=SealRule(), now=history.now)
    finally:
        store.close()
    assert result.ok, result.line()
    assert (result.seals, result.seal_age_s) == (7, 60.0)
    assert result.seal is not None
    assert result.line().endswith(
        f"; newest seal: record {history.head[0]} (periodic, {result.seal.at}, 1 min old)"
    )


async def test_a_quiet_log_with_regular_seals_verifies_intact(fresh_db_url: str) -> None:
    now = datetime.now(UTC)
    store = _open(fresh_db_url)
    try:
        for minutes in (50, 35, 20, 5):  # nothing but seals: a quiet night
            at(store, now - timedelta(minutes=minutes))
            await store.seal("start" if minutes == 50 else "periodic", EVERY_S)
        quiet = await store.verify(seals=SealRule(), now=now)
        # The same quiet log three hours on, nobody sealing: that is what a cut looks like.
        later = await store.verify(seals=SealRule(), now=now + timedelta(hours=3))
        strict = await store.verify(seals=SealRule(max_age_s=240.0), now=now)
    finally:
        store.close()
    assert quiet.ok and quiet.seals == 4, quiet.line()
    assert not later.ok and "is 3 h 5 min old, more than 30 min" in later.line()
    assert not strict.ok and "is 5 min old, more than 4 min" in strict.line()


async def test_a_log_ending_on_a_clean_stop_says_so(fresh_db_url: str) -> None:
    now = datetime.now(UTC)
    store = _open(fresh_db_url)
    try:
        at(store, now - timedelta(hours=2, minutes=1))
        await store.seal("start", EVERY_S)
        at(store, now - timedelta(hours=2))
        await store.seal("stop", EVERY_S)
        stopped = await store.verify(seals=SealRule(), now=now)
        unchecked = await store.verify(now=now)
    finally:
        store.close()
    assert not stopped.ok
    assert "the log ends with gpubot stopping (seal 3, " in stopped.line()
    assert "is 2 h old" in stopped.line()
    assert unchecked.ok  # `audit verify --max-seal-age off`: an archive, a bot stopped on purpose


async def test_a_cut_while_the_bot_runs_is_named_by_its_next_seal(fresh_db_url: str) -> None:
    """The bot goes on after the cut: the chain continues from the moved head, each seal new,
    but the next seal names the last record this bot wrote, which the log no longer holds."""
    store = _open(fresh_db_url)
    try:
        history = await sealed_history(store)
        lost = store.last_written
        assert lost == history.head
        cut_tail(fresh_db_url, history.last_action)
        at(store, history.now)
        written = await store.seal("periodic", EVERY_S)
        result = await store.verify(seals=SealRule(), now=history.now)
    finally:
        store.close()
    assert (written.prev, written.held) == (lost, False)
    assert result.seal is not None and result.seal_age_s == 0.0  # young: the age cannot tell
    assert not result.ok and result.end_tampered
    assert result.line() == (
        f"audit log tampered: seal {written.record.seq} ({written.record.created_at}) names "
        f"record {lost[0]} ({lost[1][:16]}…) as the last one gpubot wrote before it, and the "
        f"log's record {lost[0]} is another: records were removed and the chain continued"
    )

    # CONTROL: a bot started after the cut has no memory of what it wrote: its seal names
    # nothing, and the seals alone cannot tell (the head file can: the next test).
    fresh = _open(fresh_db_url)
    try:
        cut_tail(fresh_db_url, written.record.seq)  # undo the telling seal
        at(fresh, history.now)
        restarted = await fresh.seal("start", EVERY_S)
        blind = await fresh.verify(seals=SealRule(), now=history.now)
    finally:
        fresh.close()
    assert restarted.prev is None and blind.ok, blind.line()


async def test_the_head_file_catches_the_cut(fresh_db_url: str, tmp_path: Path) -> None:
    head_file = tmp_path / "audit.head"
    store = _open(fresh_db_url, head_file)
    try:
        history = await sealed_history(store)
        recorded = json.loads(head_file.read_text())
        assert (recorded["seq"], recorded["hash"]) == history.head
        cut_tail(fresh_db_url, history.last_action)
        result = await store.verify()  # no seal rule: the file alone
    finally:
        store.close()
    at_text = recorded["at"]
    new_end = history.last_action - 1
    assert not result.ok and result.end_tampered
    assert result.line() == (
        f"audit log tampered: the log ends at record {new_end}, before the head recorded "
        f"outside the database (seq {history.head[0]} at {at_text}, in {head_file}): records "
        "were removed"
    )
    # CONTROL: the same database without the head file verifies intact.
    plain = _open(fresh_db_url)
    try:
        assert (await plain.verify()).ok
    finally:
        plain.close()


async def test_the_head_file_is_kept_when_the_chain_continues_after_a_cut(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """A bot started after the cut writes on; it never overwrites the head the log lost."""
    head_file = tmp_path / "audit.head"
    store = _open(fresh_db_url, head_file)
    try:
        history = await sealed_history(store)
    finally:
        store.close()
    before = head_file.read_text()
    cut_tail(fresh_db_url, history.last_action)
    restarted = _open(fresh_db_url, head_file)
    try:
        at(restarted, history.now)
        for _ in range(12):  # past the lost head's seq
            await restarted.seal("periodic", EVERY_S)
        assert audit_rows(fresh_db_url)[-1].seq > history.head[0]
        result = await restarted.verify(seals=SealRule(), now=history.now)
    finally:
        restarted.close()
    assert head_file.read_text() == before  # the evidence stays
    assert not result.ok and result.end_tampered
    assert (
        f"record {history.head[0]} is not the head recorded outside the database "
        f"(seq {history.head[0]} at " in result.line()
    )
    assert "records were removed and the chain continued, or the log was rewritten" in (
        result.line()
    )


async def test_a_missing_or_unreadable_head_file_is_one_line(
    fresh_db_url: str, tmp_path: Path
) -> None:
    head_file = tmp_path / "audit.head"
    store = _open(fresh_db_url, head_file)
    try:
        assert (await store.verify()).ok  # an empty log needs no head
        await sealed_history(store)
        head_file.unlink()
        missing = await store.verify()
        head_file.write_text("not a head\n")
        garbage = await store.verify()
        head_file.unlink()
        head_file.mkdir()
        unreadable = await store.verify()
    finally:
        store.close()
    for result in (missing, garbage, unreadable):
        assert not result.ok and not result.end_tampered
        assert "\n" not in result.line() and result.line().startswith("audit log not verified: ")
    assert missing.end == (
        f"the head file {head_file} does not exist: gpubot has written nothing since [audit] "
        "head_file was set, or it was removed",
    )
    assert garbage.end[0].startswith(f"the head file {head_file} holds no gpubot head: ")
    assert unreadable.end == (f"cannot read the head file {head_file}: Is a directory",)


async def test_a_head_file_that_cannot_be_written_loses_no_record(
    fresh_db_url: str, tmp_path: Path
) -> None:
    head_file = tmp_path / "no-such-folder" / "audit.head"
    store = _open(fresh_db_url, head_file)
    try:
        await store.seal("start", EVERY_S)
        await store.seal("periodic", EVERY_S)
        result = await store.verify()
    finally:
        store.close()
    assert [r.kind for r in audit_rows(fresh_db_url)] == ["chain", "seal", "seal"]
    assert not result.ok and "does not exist" in result.line()


async def test_control_a_writer_that_overwrote_the_head_file_would_hide_the_cut(
    fresh_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONTROL for the test above: without the writer's check that the log still holds the
    file's head, the next write after a cut replaces the evidence and verify says intact."""
    head_file = tmp_path / "audit.head"
    store = _open(fresh_db_url, head_file)
    try:
        history = await sealed_history(store)
    finally:
        store.close()
    cut_tail(fresh_db_url, history.last_action)
    monkeypatch.setattr(Store, "_holds", lambda self, seq, digest: True)  # the defence removed
    restarted = _open(fresh_db_url, head_file)
    try:
        at(restarted, history.now)
        for _ in range(12):  # past the lost head's seq, as in the test above
            await restarted.seal("periodic", EVERY_S)
        result = await restarted.verify(seals=SealRule(), now=history.now)
    finally:
        restarted.close()
    assert json.loads(head_file.read_text())["seq"] == audit_rows(fresh_db_url)[-1].seq
    assert result.ok, result.line()  # the cut is hidden
