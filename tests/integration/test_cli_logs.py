"""Logs an operator can ship: ``--log-level`` / ``$GPUBOT_LOG_LEVEL``, ``--log-format text|json``
/ ``$GPUBOT_LOG_FORMAT``, ISO 8601 UTC times. ``gpubot db upgrade`` on a new SQLite file is the
probe: Alembic logs each migration it runs at INFO, and nothing at WARNING."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubot.cli import logs

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
MIGRATION = "INFO alembic.runtime.migration: Running upgrade  -> 0001, "


def upgrade(tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``gpubot OPTIONS db upgrade`` on a new database with ``env`` added."""
    config = tmp_path / "gpubot.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/a.db"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOT_")}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(config), *options, "db", "upgrade"],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=tmp_path,
        timeout=60,
    )


def test_the_default_is_warning_so_a_migration_logs_nothing(tmp_path: Path) -> None:
    p = upgrade(tmp_path)
    assert (p.returncode, p.stderr) == (0, "")


def test_text_lines_start_with_an_iso_utc_time(tmp_path: Path) -> None:
    p = upgrade(tmp_path, "--log-level", "info", TZ="Pacific/Kiritimati")  # UTC+14
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert lines and all(ISO_UTC.match(ln) for ln in lines), p.stderr
    (ran,) = [ln for ln in lines if MIGRATION in ln]
    assert ran.split(" ", 1)[1].startswith(MIGRATION)
    logged = datetime.strptime(ran[:23], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - logged).total_seconds()) < 120  # UTC, not the local +14 h


@pytest.mark.parametrize(
    ("options", "env"),
    [
        (("--log-format", "json", "--log-level", "INFO"), {}),
        ((), {"GPUBOT_LOG_FORMAT": "json", "GPUBOT_LOG_LEVEL": "info"}),
    ],
    ids=["flags", "environment"],
)
def test_json_is_one_object_a_line(
    tmp_path: Path, options: tuple[str, ...], env: dict[str, str]
) -> None:
    p = upgrade(tmp_path, *options, **env)
    assert p.returncode == 0, p.stderr
    docs = [json.loads(ln) for ln in p.stderr.splitlines()]
    assert docs and all(set(d) == {"time", "level", "logger", "message"} for d in docs)
    assert all(ISO_UTC.fullmatch(d["time"]) and d["level"] == "info" for d in docs)
    assert any(
        d["logger"] == "alembic.runtime.migration"
        and d["message"].startswith("Running upgrade  -> 0001, ")
        for d in docs
    )


def test_the_flag_wins_over_the_environment(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()
    (tmp_path / "flag").mkdir()
    on = upgrade(tmp_path / "env", GPUBOT_LOG_LEVEL="info")
    assert on.returncode == 0 and MIGRATION in on.stderr  # the environment alone switches it on
    off = upgrade(tmp_path / "flag", "--log-level", "warning", GPUBOT_LOG_LEVEL="info")
    assert (off.returncode, off.stderr) == (0, "")


@pytest.mark.parametrize(
    ("env", "error"),
    [
        (
            {"GPUBOT_LOG_LEVEL": "verbose"},
            "gpubot: error: GPUBOT_LOG_LEVEL='verbose': "
            "expected one of debug, info, warning, error, critical",
        ),
        (
            {"GPUBOT_LOG_FORMAT": "logfmt"},
            "gpubot: error: GPUBOT_LOG_FORMAT='logfmt': expected one of text, json",
        ),
    ],
)
def test_a_bad_environment_value_is_one_line(
    tmp_path: Path, env: dict[str, str], error: str
) -> None:
    p = upgrade(tmp_path, **env)
    assert (p.returncode, p.stderr.splitlines()) == (2, [error])
    assert not (tmp_path / "a.db").exists()  # refused before the command ran


def test_a_bad_flag_is_a_usage_error(tmp_path: Path) -> None:
    p = upgrade(tmp_path, "--log-level", "loud")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "argument --log-level: invalid choice: 'loud'" in p.stderr


def test_a_json_exception_stays_on_its_line() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    log = logging.getLogger("gpubot.test_cli_logs")
    log.addHandler(handler)
    log.propagate = False
    try:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            log.exception("it failed: %s", "здесь")
    finally:
        log.removeHandler(handler)
        log.propagate = True
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"] == "it failed: здесь" and doc["level"] == "error"
    assert doc["exception"].startswith("Traceback") and "ValueError: bad\nvalue" in doc["exception"]


def test_iso_utc_keeps_milliseconds() -> None:
    assert logs.iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert logs.iso_utc(1_700_000_000.987) == "2023-11-14T22:13:20.987Z"
