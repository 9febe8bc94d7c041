"""``gpubot doctor``'s descriptor line (issue 24): the pure check over a table of limits, and the
command itself run under a soft and hard limit of 1,024 with 1,500 nodes configured (✗ with the
number to set) beside the same fleet under a hard limit that allows it (✓, the control)."""

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
from gpubot.core.doctor.limits import AREA, NAME, descriptor_check


@pytest.mark.parametrize(
    ("nodes", "soft", "hard", "ok", "shown"),
    [
        (1500, 1024, 1024, False, "soft 1024, hard 1024: 896 SSH connections for 1500 nodes"),
        (896, 1024, 1024, True, "soft 1024, hard 1024: 896 SSH connections for 896 nodes"),
        (897, 1024, 1024, False, "897 nodes"),
        (
            1500,
            1024,
            524288,
            True,
            "soft 1024, hard 524288 (raised to 524288 at start): 458752 SSH connections",
        ),
        (1, 1024, None, True, "hard unlimited (raised to 1048576 at start)"),
        (1, 1024, 1024, True, "for 1 node"),
        (0, 64, 64, True, "1 SSH connections for 0 nodes"),
        (2000, 16384, 16384, True, "14336 SSH connections for 2000 nodes"),
    ],
)
def test_the_line_says_the_limits_and_the_connections_they_allow(
    nodes: int, soft: int, hard: int | None, ok: bool, shown: str
) -> None:
    check = descriptor_check(nodes, soft, hard)
    assert (check.area, check.name, check.ok) == (AREA, NAME, ok)
    assert shown in check.detail
    assert bool(check.fix) == (not ok)


def test_a_limit_too_small_names_the_number_that_is_enough() -> None:
    check = descriptor_check(1500, 1024, 1024)
    want = fdbudget.needed(1500)
    assert f"LimitNOFILE={want} " in check.fix and f"ulimit -Hn {want}" in check.fix
    assert "closed and reopened" in check.detail
    assert descriptor_check(1500, want, want).ok  # the number given is enough ...
    assert not descriptor_check(1500, want - 1, want - 1).ok  # ... and the smallest that is


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
