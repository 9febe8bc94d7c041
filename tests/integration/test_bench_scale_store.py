"""``benchmarks.scale_store --smoke`` still runs end to end (not a timing test).

It checks that the old and the new idle paths agreed at every steady sweep (the benchmark
asserts it), that both sweep-record shapes were measured and that every stall row is there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_scale_store_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale_store", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "| 1 d (3,840 rows)" in out and "| 2 d (7,680 rows)" in out, out
    assert "Sweep audit record at 20 nodes: old 227 bytes; new 151 bytes" in out, out
    rows = [ln for ln in out.splitlines() if ln.startswith(("| old ", "| new "))]
    assert len(rows) == 2, out
