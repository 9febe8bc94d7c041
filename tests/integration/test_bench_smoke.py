"""The benchmark's smoke mode (N=4, one run each) still works end to end.

Not a timing test: it checks that every method did the whole job (each node, each GPU), that
both resets ended freed, that every Slack request was acknowledged and answered, and that the
report has its tables. Methods whose optional package is not installed must say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPTIONAL = ("pssh", "pssh:probe", "ansible")


@pytest.mark.timeout(300)
def test_smoke_run_measures_every_part(tmp_path: Path) -> None:
    out, raw = tmp_path / "report.md", tmp_path / "raw.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--smoke",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(raw.read_text())

    status = data["status"]["4"]
    for method, series in status.items():
        if series["missing"]:
            assert method in OPTIONAL and series["missing"].startswith("not installed"), method
            continue
        samples = series["samples"]
        assert len(samples) == 1, method
        assert all(s["ok"] for s in samples), (method, [s["note"] for s in samples])
        assert all(s["wall"] > 0 and s["cpu"] >= 0 for s in samples), (method, samples)
    assert not status["gpubot-cold"]["missing"] and not status["gpubot-warm"]["missing"]

    for behaviour in ("normal", "stubborn"):
        (run,) = data["reset"][behaviour]
        assert run["outcome"] == "freed", run
        assert run["signals"] == (["SIGTERM"] if behaviour == "normal" else ["SIGTERM", "SIGKILL"])
        seg = run["segments"]
        parts = ("planning", "signalling", "exit", "release", "overhead")
        assert abs(sum(seg[p] for p in parts) - seg["total"]) < 1e-6
        assert all(seg[p] >= 0 for p in parts)  # timings are reported, not asserted (a busy CI)

    # The bot with the fleet yielding it the CPU (as deployed), then at equal priority.
    yields, equal = data["slack"]
    assert "fleet yields CPU" in yields["label"] and "equal CPU priority" in equal["label"]
    for burst in (yields, equal):
        assert burst["bad"] == burst["busy_bad"] == []
        assert len(burst["acks"]) == len(burst["busy_acks"]) == burst["requests"] == 10
        assert burst["answered"] == 20

    (rendered, with_failures) = data["slack_render"]
    assert rendered["nodes"] == 1000 and rendered["problems"] == []
    assert with_failures["failing"] == 100 and with_failures["problems"] == []

    report = out.read_text()
    for heading in (
        "### Fleet status",
        "### Reset latency",
        "### Slack acknowledgement",
        "### Extrapolation to 1000 nodes",
        "### Ratios and targets",
    ):
        assert heading in report
    assert report == proc.stdout.strip() + "\n"


@pytest.mark.timeout(180)
def test_smoke_scale_runs_a_bot_over_a_fleet(tmp_path: Path) -> None:
    out, raw = tmp_path / "report.md", tmp_path / "raw.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--smoke",
            "--only",
            "scale",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scale = json.loads(raw.read_text())["scale"]
    assert scale["nodes"] == 16 and scale["fleet"]["workloads"] == 2
    for phase in ("cold", "warm", "sweep"):
        p = scale["phases"][phase]
        assert not p.get("skipped"), p
        assert (p["answered"], p["failed"]) == (16, 0), (phase, p["reasons"])
        assert p["wall"] > 0 and p["cpu"] >= 0 and p["rss_kib"] > 0
    assert scale["phases"]["cold"]["render_problems"] == []
    assert scale["phases"]["cold"]["short"] == []
    assert "### A running bot over 16 simulated nodes" in out.read_text()


@pytest.mark.timeout(150)
def test_smoke_slack_ack_during_a_sweep_over_the_scale_fleet(tmp_path: Path) -> None:
    out, raw = tmp_path / "report.md", tmp_path / "raw.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.slack_ack_scale",
            "--smoke",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(raw.read_text())
    equal, yields = data["arms"]
    assert "equal CPU priority" in equal["label"] and equal["yields"] == ""
    assert "fleet yields CPU" in yields["label"] and yields["yields"]
    for arm in (equal, yields):
        assert arm["nodes"] == 4 and arm["fleet_work_seen"], arm
        assert arm["bad"] == [] and len(arm["acks"]) == arm["requests"] == 5, arm
        assert arm["answered"] == 5 and arm["max_stall_s"] is not None, arm
        assert arm["answer_nodes"] and all(a == [4, 0] for a in arm["answer_nodes"]), arm
        assert len(arm["load_before"].split()) == 5 and arm["load_after"], arm
    report = out.read_text()
    assert "### Slack acknowledgement during a sweep at 4 nodes" in report
    rows = [line for line in report.splitlines() if line.startswith("| fleet ")]
    assert len(rows) == 3 and "equal CPU priority" in rows[1] and "yields" in rows[2], rows
