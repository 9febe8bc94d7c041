"""Looking at real processes from tests: liveness and command lines read from /proc."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead: its files are closed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in {"Z", "X"}
    except FileNotFoundError:
        return False


def cmdlines() -> dict[int, str]:
    """Return every process's command line, NULs as spaces."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                out[int(entry.name)] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
    return out


def remote_probes(fleet: Any) -> list[int]:
    """Return the pids of probes or nvidia-smi calls still running on a simulated fleet's nodes."""
    root = str(fleet.root)
    return [
        pid
        for pid, cmd in cmdlines().items()
        if root in cmd and ("gpubot-probe" in cmd or "nvidia-smi" in cmd)
    ]
