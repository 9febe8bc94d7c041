"""``benchmarks/prom_sweep.py``'s smoke mode (16 nodes, 2 candidates) still works end to end.

Not a timing test: the benchmark's own checks (each narrowed sweep asked the candidates alone,
and every sweep found their leaked memory and nothing else) decide its exit status.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_smoke_narrowed_and_full_sweeps_find_the_same() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.prom_sweep", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| full", "| narrowed"))]
    assert len(rows) == 4 and "checks: passed" in proc.stdout, proc.stdout
    narrowed = [r.split("|") for r in rows if r.startswith("| narrowed")]
    assert all(cells[6].strip() == "2" for cells in narrowed), rows  # nodes asked: the 2 named
