"""``gpubot audit verify`` on a keyed, sealed log with a head file, on SQLite and PostgreSQL:
its text and ``--json`` before and after the tail cut of issue 21 (case 4), and the settings
and options that turn each check off (the controls)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.store import open_store
from tests.fixtures.audit_cut import KEY, History, cut_tail, sealed_history


def _history(url: str, head_file: Path) -> History:
    store = open_store(url, audit_key=KEY, head_file=str(head_file))
    try:
        return asyncio.run(sealed_history(store, datetime.now(UTC)))
    finally:
        store.close()


def _verify(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    url: str,
    audit: str,
    *argv: str,
) -> tuple[int, str, str]:
    """Run ``gpubot audit verify ARGV`` in-process with the key and an ``[audit]`` table."""
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n\n[audit]\n{audit}\n', encoding="utf-8")
    monkeypatch.setenv("GPUBOT_AUDIT_KEY", KEY.decode())
    code = main(["--config", str(cfg), "audit", "verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_reports_the_seal_and_the_head_file_then_catches_the_cut(
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head_file = tmp_path / "audit.head"
    history = _history(fresh_db_url, head_file)
    audit = f'head_file = "{head_file}"'
    code, out, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit)
    seq = history.head[0]
    assert (code, err) == (0, "")
    assert re.fullmatch(
        rf"audit log intact: {seq} records, head {seq}:{history.head[1]}, keyed \(HMAC-SHA256 "
        r"from record 1, key id [0-9a-f]{16}\); newest seal: record "
        rf"{seq} \(periodic, [0-9T:.-]+Z, [0-9]+ (s|min) old\); holds the head file's record {seq} "
        r"\([0-9T:.-]+Z\)\n",
        out,
    ), out
    code, out, _ = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["end"] == [] and data["seals"] == 7
    assert data["seal"]["seq"] == seq and data["seal"]["reason"] == "periodic"
    assert data["head_file"]["seq"] == seq and data["head"] == f"{seq}:{history.head[1]}"

    cut_tail(fresh_db_url, history.last_action)
    code, out, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit)
    kept = history.last_action - 1
    assert (code, out) == (1, "") and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"gpubot: audit log tampered: the newest seal (record {kept}, periodic")
    assert "is 45 min old, more than 30 min ([audit] max_seal_age)" in err
    assert (
        f"; the log ends at record {kept}, before the head recorded outside the database "
        f"(seq {seq} at " in err
    )
    code, out, _ = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit, "--json")
    data = json.loads(out)
    assert code == 1 and not data["ok"] and data["end_tampered"]
    assert len(data["end"]) == 2 and data["seal"]["seq"] == kept
    assert data["verdict"] == err.removeprefix("gpubot: ").rstrip("\n")


def test_the_old_verify_says_intact_after_the_cut(
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONTROL: without the head file and with the seal age off, verify is the chain alone."""
    history = _history(fresh_db_url, tmp_path / "audit.head")
    cut_tail(fresh_db_url, history.last_action)
    kept = history.last_action - 1
    controls: list[tuple[str, tuple[str, ...]]] = [
        ('max_seal_age = "off"', ()),
        ("", ("--max-seal-age", "off")),
        ('seal_every = "off"', ()),
    ]
    for audit, argv in controls:
        code, out, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit, *argv)
        assert (code, err) == (0, ""), audit
        assert out.startswith(f"audit log intact: {kept} records, head {kept}:")
    code, _, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, "")
    assert code == 1 and "is 45 min old, more than 30 min" in err  # the default checks
    code, _, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, "", "--max-seal-age", "2h")
    assert code == 0, err  # a limit the operator chose


@pytest.mark.parametrize("value", ["soon", "0m", "-5m", "30"])
def test_a_bad_max_seal_age_is_one_line(
    store_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    code, out, err = _verify(
        capsys, monkeypatch, tmp_path, store_url, "", f"--max-seal-age={value}"
    )
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "--max-seal-age: expected a duration" in err and "or off" in err


def test_a_missing_head_file_is_one_line(
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head_file = tmp_path / "audit.head"
    _history(fresh_db_url, head_file)
    head_file.unlink()
    audit = f'head_file = "{head_file}"'
    code, out, err = _verify(capsys, monkeypatch, tmp_path, fresh_db_url, audit)
    assert (code, out) == (1, "")
    assert err == (
        f"gpubot: audit log not verified: the head file {head_file} does not exist: gpubot has "
        "written nothing since [audit] head_file was set, or it was removed\n"
    )
