"""Issue 24's later benchmarks still run end to end in their smoke sizes (not timing tests):
the loop-stall arms (``sweep_heap``: every sweep answered in both arms, the heap arm with no
full collection), gpubot's own CPU (``status_cpu``), the store's growth (``store_growth``),
the SSH ciphers (``ssh_ciphers``), the first sweep's store and loop (``first_sweep``) and a
warm ``status all`` over SSH beside the floor (``status_floor``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def smoke(module: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.timeout(300)
def test_the_sweep_heap_arms_run_side_by_side() -> None:
    out = smoke("sweep_heap")
    rows = [ln for ln in out.splitlines() if ln.startswith(("| base ", "| heap "))]
    assert len(rows) == 4, out  # one round of two sweeps, each arm
    assert "- heap: " in out and "full GCs 0 in 2 sweeps" in out.split("- heap: ")[1], out


@pytest.mark.timeout(300)
def test_status_cpu_measures_a_warm_status_and_a_sweep() -> None:
    out = smoke("status_cpu", "--profile")
    (row,) = [ln for ln in out.splitlines() if ln.startswith("| this |")]
    status, sweep = (float(cell) for cell in row.split("|")[2:4])
    assert status > 0 and sweep > 0, out
    assert "this, status_profile:" in out and "this, parse_profile:" in out, out


@pytest.mark.timeout(300)
def test_store_growth_measures_records_and_samples() -> None:
    out = smoke("store_growth")
    (row,) = [ln for ln in out.splitlines() if ln.startswith("| sqlite |")]
    per_record, per_sample = float(row.split("|")[2]), float(row.split("|")[4])
    assert 50 < per_record < 5000 and 10 < per_sample < 1000, out


@pytest.mark.timeout(300)
def test_the_cipher_arms_run_side_by_side() -> None:
    out = smoke("ssh_ciphers")
    rows = [ln for ln in out.splitlines() if ln.startswith(("| floor:", "| gpubot:"))]
    assert len(rows) == 4 and all(float(r.split("|")[3]) > 0 for r in rows), out


@pytest.mark.timeout(300)
def test_the_first_sweep_arms_run_side_by_side() -> None:
    out = smoke("first_sweep")
    rows = [ln for ln in out.splitlines() if ln.startswith(("| old ", "| batched ", "| now "))]
    assert len(rows) == 3, out  # one round of one sweep, each arm
    advance = [float(r.split("|")[6]) for r in rows]  # the store thread's CPU in its biggest call
    assert all(a > 0 for a in advance), out


@pytest.mark.timeout(300)
def test_the_status_floor_arms_run_side_by_side_over_ssh() -> None:
    out = smoke("status_floor")
    rows = [ln for ln in out.splitlines() if ln.startswith(("| floor ", "| gpubot "))]
    assert len(rows) == 2 and all(float(r.split("|")[3]) > 0 for r in rows), out
    assert "- gpubot: " in out and " gap " in out, out


@pytest.mark.timeout(300)
def test_the_status_floor_stalls_follow_a_new_bot_over_ssh() -> None:
    out = smoke("status_floor", "--stalls")
    rows = [ln for ln in out.splitlines() if ln.startswith(("| now ", "| no-pause "))]
    assert len(rows) == 10 and all("| 4/4 " in r for r in rows), out  # every node, every phase
