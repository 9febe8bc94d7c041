"""The probe's cost on one node, usual and hostile: ``python -m benchmarks.probe_cost``.

::

    python -m benchmarks.probe_cost --holders 200 --repeat 3    # as root (holders run as nobody)

One simulated node (2 GPUs, 2 GPU processes), its probe run here by ``bash`` (no SSH: the remote
work alone), in three cases: the usual node; the same plus ``--holders`` processes that hold only
``nvidiactl``/``nvidia-uvm`` with 4 KiB of non-ASCII argv each (issue 21: they stalled the probe);
and the same number holding GPU 0's device file instead (read from ``/proc``, so the escaping's
cost shows). Each case runs the probe as it is and, side by side, the probe of commit
``BASELINE`` (before issue 21), which is killed at ``--baseline-timeout`` seconds. The figure is
the median wall time of ``--repeat`` runs; every run's output is checked to end with the end
marker (or the budget's "over" marker).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import fmt_s, table
from gpubot.config import load
from gpubot.core.probe import probe_argv
from gpusim.fleet import SimFleet

BASELINE = "63a07c8"  # the last commit before issue 21's probe changes
T = 9.0  # each query's limit under the default 20 s command timeout


def baseline_script(repo: Path) -> str | None:
    """Return the probe script of ``BASELINE``, or None without git history."""
    try:
        text = subprocess.run(
            ["git", "show", f"{BASELINE}:gpubot/core/probe_script.py"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    ns: dict[str, Any] = {}
    exec(compile(text, "probe_script@baseline", "exec"), ns)
    return str(ns["PROBE_SCRIPT"])


def nonascii(n: int = 4096) -> bytes:
    """``n`` bytes of UTF-8 text (Latin, Greek, CJK): almost no byte is ASCII."""
    text = "".join(
        chr(c) for c in [*range(0xC0, 0x250), *range(0x391, 0x3C9), *range(0x4E00, 0x4F00)]
    )
    return (text * 4).encode()[:n].decode("utf-8", "ignore").encode()


def holders(files: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``sleep`` processes of nobody's holding ``files``, 4 KiB non-ASCII argv."""
    fds = [os.open(f, os.O_RDWR) for f in files]
    try:
        return [
            subprocess.Popen(
                [nonascii(), "600"],
                executable="/bin/sleep",
                pass_fds=fds,
                user="nobody" if os.geteuid() == 0 else None,
                stdin=subprocess.DEVNULL,
            )
            for _ in range(count)
        ]
    finally:
        for fd in fds:
            os.close(fd)


def once(argv: list[str], timeout: float) -> float | None:
    """Return one run's wall time; None when it ran past ``timeout`` (killed)."""
    t = time.monotonic()
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return None
    took = time.monotonic() - t
    if "\n@gpubot end" not in p.stdout:
        raise SystemExit(f"probe output without its end marker: {p.stdout[-300:]!r} {p.stderr!r}")
    return took


def measure(argvs: dict[str, list[str]], repeat: int, cap: float) -> dict[str, str]:
    out = {}
    for name, argv in argvs.items():
        runs = [once(argv, cap if name == "before" else 60.0) for _ in range(repeat)]
        done = [r for r in runs if r is not None]
        out[name] = (
            fmt_s(statistics.median(done)) if len(done) == len(runs) else f"> {cap:g} (killed)"
        )
    return out


def run(count: int = 200, repeat: int = 3, baseline_timeout: float = 60.0) -> list[str]:
    """Measure every case, before and after; return the report's Markdown lines."""
    old = baseline_script(Path(__file__).resolve().parent.parent)
    rows = []
    with tempfile.TemporaryDirectory() as work, SimFleet(work, nodes=1, gpus=2) as fleet:
        node = fleet.node("node1")
        cfg = load(fleet.config_path).node("node1")
        assert cfg is not None
        jobs = [node.spawn(gpu=0, mib=1000), node.spawn(gpu=1, mib=2000)]
        new = probe_argv(cfg, smi_timeout_s=T)
        before = [*new[:12], *new[13:]]  # no budget argument then
        if old is not None:
            before[2] = old
        cases = {
            "usual (2 GPU processes)": [],
            f"+ {count} ctl-only holders, 4 KiB non-ASCII argv": [
                f"{cfg.dev_prefix}ctl",
                f"{cfg.dev_prefix}-uvm",
            ],
            f"+ {count} holders of GPU 0's file, 4 KiB non-ASCII argv": [node.device(0)],
        }
        for case, files in cases.items():
            extra = holders(files, count) if files else []
            try:
                argvs = {"after": new, **({"before": before} if old is not None else {})}
                got = measure(argvs, repeat, baseline_timeout)
                rows.append([case, got.get("before", "-"), got["after"]])
                print(f"{case}: {got}", file=sys.stderr, flush=True)
            finally:
                for h in extra:
                    h.kill()
                    h.wait()
        for j in jobs:
            os.kill(j.pid, 9)
    return [
        f"### The probe's cost on one node (median of {repeat}, seconds)",
        "",
        table(["case", f"before ({BASELINE})", "after"], rows),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the probe's cost benchmark alone; print its table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.probe_cost")
    p.add_argument("--holders", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline-timeout", type=float, default=60.0)
    a = p.parse_args(argv)
    print("\n".join(run(a.holders, a.repeat, a.baseline_timeout)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
