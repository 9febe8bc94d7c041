"""Programs one node's remote work starts: the baseline's two queries against gpubot's probe.

Counted with ``strace -f -e trace=execve`` (successful calls only: a PATH search's misses are not
programs), run locally as the fleet's login user on the first simulated node, with its GPU
processes in place. The target is at most 4 programs per probe in the common case.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from gpusim.fleet import SimFleet

LIMIT = 4
_EXECVE = re.compile(r'^\d+\s+execve\("([^"]*)".*\)\s+=\s+0\s*$')


def programs(argv: list[str], user: str | None) -> list[str] | None:
    """Return the basename of every program ``argv`` runs (itself first), or None without
    strace."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "trace"
        cmd = [strace, "-f", "-qq", "-e", "trace=execve", "-o", str(log)]
        if user is not None:
            cmd += ["-u", user]
        subprocess.run(
            [*cmd, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            timeout=120,
            check=False,
        )
        names = []
        for line in log.read_text(errors="replace").splitlines():
            m = _EXECVE.match(line)
            if m:
                names.append(Path(m[1]).name)
    return names


def count(fleet: SimFleet, user: str | None, procs: int) -> dict[str, Any]:
    """Programs of the baseline and of gpubot's probe on the fleet's first node (``procs`` GPU
    processes on it)."""
    from benchmarks.worker import baseline_command
    from gpubot.config import load
    from gpubot.core.probe.snapshot import probe_argv

    node = load(fleet.config_path).nodes[0]
    runs = {
        "baseline (2 queries)": ["sh", "-c", baseline_command(node.nvidia_smi)],
        "gpubot probe": probe_argv(node, smi_timeout_s=18.0),
    }
    out: dict[str, Any] = {"gpu_processes": procs}
    for name, argv in runs.items():
        out[name] = programs(argv, user)
    return out


def report(ex: dict[str, Any] | None) -> list[str]:
    """Markdown lines: each command's programs, and the probe's count against the limit."""
    if not ex:
        return []
    rows = []
    for name in ("baseline (2 queries)", "gpubot probe"):
        names = ex.get(name)
        if names is None:
            rows.append(f"- {name}: not counted (no strace here)")
            continue
        counts = collections.Counter(names)
        listed = ", ".join(f"{k} ×{v}" if v > 1 else k for k, v in counts.items())
        verdict = ""
        if name == "gpubot probe":
            verdict = f" (target ≤ {LIMIT}: {'met' if len(names) <= LIMIT else 'MISSED'})"
        rows.append(f"- {name}: {len(names)} programs: {listed}{verdict}")
    return [
        f"Programs one node's remote work starts (`strace -f`, successful `execve` calls; one node "
        f"with {ex.get('gpu_processes', '?')} GPU process(es) of an ordinary user):",
        "",
        *rows,
        "",
    ]
