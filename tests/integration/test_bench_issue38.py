"""Issue 38's benchmark still runs end to end in its smoke size (not a timing test): the fleet
summary from a real Prometheus beside the SSH fan-out of the same summary (``prom_summary``),
each arm's every node answered by its own path (the benchmark exits non-zero otherwise), and
its profile of the Prometheus arm's parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def smoke(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.prom_summary", "--smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.timeout(300)
def test_the_prometheus_and_ssh_summaries_run_side_by_side(tmp_path: Path) -> None:
    raw = tmp_path / "raw.json"
    out = smoke("--json", str(raw))
    res = json.loads(raw.read_text())
    assert (res["prom_nodes"], res["nodes"]) == (6, 4) and res["series"] == 6 * 8 * 23
    for arm in ("prometheus", "ssh"):
        figures = res["arms"][arm]
        assert len(figures["wall"]) == 1 and figures["wall"][0] > 0 and figures["cpu"][0] > 0
    rows = [ln for ln in out.splitlines() if ln.startswith(("| prometheus ", "| ssh "))]
    assert len(rows) == 2 and "- Prometheus: " in out and "- SSH: " in out, out


@pytest.mark.timeout(300)
def test_the_profile_splits_the_prometheus_arm() -> None:
    out = smoke("--profile")
    assert "6 queries answered" in out and "JSON decode" in out and "fold" in out, out
