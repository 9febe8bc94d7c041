"""``gpubot doctor``'s command line, where no node needs asking: no settings, a bad target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubot.cli import run_command


def test_no_settings_file_is_one_failure_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_command(["--config", str(tmp_path / "none.toml"), "doctor"])
    out = capsys.readouterr().out
    assert code == 1
    assert "✗ settings file" in out and "no such file" in out
    assert "fix: write one from gpubot.example.toml" in out


def test_an_unknown_target_is_named_and_nothing_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = tmp_path / "g.toml"
    path.write_text(
        f'[ssh]\nknown_hosts = "{known}"\n[[nodes]]\nname = "a"\nhost = "192.0.2.1"\n',
        encoding="utf-8",
    )
    monkeypatch.delenv("GPUBOT_AUDIT_KEY", raising=False)
    code = run_command(["--config", str(path), "doctor", "nope", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False
    (bad,) = [c for c in doc["checks"] if not c["ok"]]
    assert (bad["check"], bad["fix"]) == ("node nope", "one of: a")
    assert not any(c["area"] == "a" for c in doc["checks"])
