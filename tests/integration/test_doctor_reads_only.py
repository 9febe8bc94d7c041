"""``gpubot doctor`` only reads: run as a real process in a fresh working folder, it leaves the
folder exactly as it found it, whether the settings name no database (the default
``sqlite:///gpubot.db`` there, which it reports missing instead of creating) or an existing
one (opened, read, closed: no table, no ``-wal``/``-shm`` left, not a byte changed).

The control is the store itself: opening the same settings the way every other command does
creates ``gpubot.db`` in that folder, so the first test would fail if the doctor still did."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubot.store import open_store

SCRUBBED = ("GPUBOT_CONFIG", "GPUBOT_AUDIT_KEY", "SLACK_BOT_TOKEN", "SLACK_API_URL")
SETTINGS = '[ssh]\nknown_hosts = "/dev/null"\n'  # no [database]: the default, in the cwd


def doctor(folder: Path) -> tuple[int, dict[str, Any]]:
    """Run ``gpubot doctor --json`` in ``folder``; return its exit status and its document."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    p = subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", "gpubot.toml", "doctor", "--json"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)


def listing(folder: Path) -> dict[str, tuple[int, str]]:
    """Return every file under ``folder`` (hidden ones too) with its mode and content hash."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(folder)) + "/": (0, "") for p in folder.rglob("*") if p.is_dir()}


def database_checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in doc["checks"] if c["area"] == "database"}


def test_with_no_database_named_the_folder_is_left_as_found(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "gpubot.toml").write_text(SETTINGS, encoding="utf-8")
    before = listing(folder)
    code, doc = doctor(folder)
    assert listing(folder) == before == {"gpubot.toml": before["gpubot.toml"]}
    [missing] = database_checks(doc).values()  # one line, as a finding
    assert code == 1 and (missing["check"], missing["ok"]) == ("exists", False)
    assert f"{folder / 'gpubot.db'}: no such file" in missing["detail"]
    assert "gpubot db upgrade" in missing["fix"]


def test_the_control_the_store_creates_the_default_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the doctor used to do: the store, opened on these settings, makes ``gpubot.db``."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    open_store("sqlite:///gpubot.db").close()
    assert "gpubot.db" in listing(folder)


def test_an_existing_database_is_read_not_changed(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "gpubot.toml").write_text(SETTINGS, encoding="utf-8")
    open_store(f"sqlite:///{folder / 'gpubot.db'}").close()  # created and migrated
    before = listing(folder)
    assert set(before) == {"gpubot.toml", "gpubot.db"}
    code, doc = doctor(folder)
    assert listing(folder) == before
    checks = database_checks(doc)
    assert all(c["ok"] for c in checks.values()), checks
    assert {"opens", "migrated", "writable", "file private", "audit key"} <= set(checks)
    assert code == 0, doc
