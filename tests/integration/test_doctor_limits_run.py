"""``gpubot doctor`` run as a process under a small descriptor limit with a large fleet: the line
and its fix as a person sees them (the check's table is ``tests/unit/test_doctor_limits.py``)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpubot.core import fdbudget
from gpubot.core.doctor.limits import AREA, NAME


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _doctor(tmp_path: Path, soft: int, hard: int) -> tuple[int, dict[str, object]]:
    """Run ``gpubot doctor n0 --json`` under (soft, hard) with 1,500 nodes configured."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    port = _closed_port()
    nodes = "".join(
        f'[[nodes]]\nname = "n{i}"\nhost = "127.0.0.1"\nport = {port}\n' for i in range(1500)
    )
    config = tmp_path / "g.toml"
    config.write_text(f'[ssh]\nknown_hosts = "{known}"\n{nodes}', encoding="utf-8")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOT_", "SLACK_"))}
    argv = [sys.executable, "-m", "gpubot", "--config", str(config), "doctor", "n0", "--json"]
    p = subprocess.run(
        argv, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120, cwd=tmp_path
    )
    assert "Traceback" not in p.stderr
    return p.returncode, json.loads(p.stdout)


def _line(doc: dict[str, object]) -> dict[str, object]:
    checks = doc["checks"]
    assert isinstance(checks, list)
    (line,) = [c for c in checks if (c["area"], c["check"]) == (AREA, NAME)]
    assert isinstance(line, dict)
    return line


def test_doctor_under_1024_with_1500_nodes_says_so_with_its_fix(tmp_path: Path) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.fail(f"this test needs a hard descriptor limit of 4096 or more, not {hard}")
    code, doc = _doctor(tmp_path, 1024, 1024)
    line = _line(doc)
    assert code == 1 and line["ok"] is False
    assert line["detail"] == (
        "soft 1024, hard 1024: 896 SSH connections for 1500 nodes: idle connections are "
        "closed and reopened (slower)"
    )
    assert f"LimitNOFILE={fdbudget.needed(1500)}" in str(line["fix"])
    # The control: the same fleet, a hard limit gpubot raises its soft one to, passes.
    _code, doc = _doctor(tmp_path, 1024, 4096)
    line = _line(doc)
    assert line["ok"] is True and line["fix"] is None
    assert str(line["detail"]).startswith("soft 1024, hard 4096 (raised to 4096 at start)")
