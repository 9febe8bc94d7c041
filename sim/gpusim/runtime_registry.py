"""What the runtime stand-ins share: the node's registry (containers, jobs, units), and stopping.

Standalone (standard library only, relative imports only), like ``runtimes`` which documents the
registry's format (``<state>/runtimes.json``, read and written under the node's state lock).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import time
from typing import Any

from . import simstate

REGISTRY_FILE = "runtimes.json"
RESTARTS = ("no", "always", "on-failure", "unless-stopped")
KILL_WAIT_S = 5.0
Entry = dict[str, Any]


# ---- the registry ------------------------------------------------------------------------------


def load(state_dir: str) -> dict[str, Any]:
    """Read the node's registry (call with the state lock held)."""
    try:
        with open(os.path.join(state_dir, REGISTRY_FILE), encoding="utf-8") as f:
            reg: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        reg = {"delay_s": 0.0, "entries": []}
    return reg


def save(state_dir: str, reg: dict[str, Any]) -> None:
    """Replace the node's registry atomically (call with the state lock held)."""
    tmp = os.path.join(state_dir, f".{REGISTRY_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(reg, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(state_dir, REGISTRY_FILE))


def register(state_dir: str, entry: Entry) -> None:
    """Add one entry to the node's registry."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        reg["entries"].append(entry)
        save(state_dir, reg)


def set_delay(state_dir: str, seconds: float) -> None:
    """Make every stand-in of the node sleep ``seconds`` before answering."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        reg["delay_s"] = float(seconds)
        save(state_dir, reg)


def clear(state_dir: str) -> None:
    """Forget every entry and the delay."""
    with simstate.locked(state_dir):
        save(state_dir, {"delay_s": 0.0, "entries": []})


# ---- processes -----------------------------------------------------------------------------------


def members(directory: str) -> list[int]:
    """Return the pids in the cgroup ``directory`` and every cgroup below it."""
    out: list[int] = []
    for here, _dirs, files in os.walk(directory):
        if "cgroup.procs" in files:
            with (
                contextlib.suppress(OSError, ValueError),
                open(os.path.join(here, "cgroup.procs"), encoding="ascii") as f,
            ):
                out += [int(x) for x in f.read().split()]
    return out


def kill_members(directory: str, v2_path: str, sig: int) -> int:
    """Signal every process of the cgroup ``directory`` still in ``v2_path``; return how many.

    Each is pinned with a pidfd, then its own /proc/PID/cgroup is checked: a reused pid that
    now belongs elsewhere is never signalled.
    """
    sent = 0
    for pid in members(directory):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                lines = f.read().splitlines()
            if any(ln == f"0::{v2_path}" or ln.startswith(f"0::{v2_path}/") for ln in lines):
                signal.pidfd_send_signal(fd, sig)
                sent += 1
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.ENOENT):
                raise
        finally:
            os.close(fd)
    return sent


def _wait(cond: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop(state_dir: str, entry: Entry, state: str, grace_s: float) -> int:
    """End an entry for good: mark it, kill its supervisor, TERM, then KILL; return the code."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        for e in reg["entries"]:
            if e["kind"] == entry["kind"] and e["id"] == entry["id"] and e["state"] == "running":
                e["state"] = state
        save(state_dir, reg)
    sup, sup_ticks = entry.get("supervisor_pid"), entry.get("supervisor_start_ticks")
    # The supervisor first: nothing restarts now.
    if sup is not None and simstate.signal_if(sup, sup_ticks, signal.SIGKILL):
        _wait(lambda: not simstate.is_alive(int(sup), int(sup_ticks or 0)), 5.0)
    top, path = entry["top"], entry["cgroup"]
    code = 143
    if kill_members(top, path, signal.SIGTERM) and not _wait(lambda: not members(top), grace_s):
        kill_members(top, path, signal.SIGKILL)
        _wait(lambda: not members(top), 5.0)
        code = 137
    with simstate.locked(state_dir):
        reg = load(state_dir)
        for e in reg["entries"]:
            if e["kind"] == entry["kind"] and e["id"] == entry["id"] and e["exit_code"] is None:
                e.update(finished=time.time(), exit_code=code)
        save(state_dir, reg)
    return code


def live(entry: Entry, allocs: list[dict[str, Any]]) -> tuple[bool, int, int, float | None]:
    """Return ``(running, pid or 0, restart count, died at)`` of an entry now."""
    sup = entry.get("supervisor_pid")
    if sup is not None:
        mine = [
            a
            for a in allocs
            if a.get("supervisor") == sup and a.get("registered_at", 0) >= entry["created"] - 1
        ]
        up = [a for a in mine if simstate.is_alive(a["pid"], a["start_ticks"])]
        running = simstate.is_alive(sup, entry["supervisor_start_ticks"])
        died = max((a.get("died_at") or 0 for a in mine), default=0) or None
        return running, up[-1]["pid"] if up and running else 0, max(0, len(mine) - 1), died
    running = simstate.is_alive(entry["pid"], entry["start_ticks"])
    me = (entry["pid"], entry["start_ticks"])
    died = next((a.get("died_at") for a in allocs if (a["pid"], a["start_ticks"]) == me), None)
    return running, entry["pid"] if running else 0, 0, died


def err(*lines: str) -> None:
    """Print ``lines`` on stderr, as the real programs print their errors."""
    for line in lines:
        print(line, file=sys.stderr)
