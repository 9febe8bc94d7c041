"""The shared state of one simulated GPU node: one JSON file guarded by one file lock.

This module is standalone (standard library only, relative imports only): the fleet copies it,
with ``nvidia_smi.py`` and ``workload.py``, into ``<fleet>/lib/gpusim/`` so that the stand-in
``nvidia-smi`` and the workload processes run with the system Python as any user.

A node directory holds ``state.json`` (GPUs, allocations, fault, overrides), ``state.lock``,
``dev/`` (device files), ``bin/`` (``nvidia-smi``), ``exe/`` (process-name links) and ``run/``
(pid files of hung ``nvidia-smi`` calls). Every reader and writer takes the lock, so concurrent
``nvidia-smi`` calls see one consistent state.

An allocation is one process's claim on one GPU, keyed by pid AND kernel start time (field 22
of ``/proc/PID/stat``), so a reused pid never inherits it. Its memory counts until it is
released: ``release_delay_s`` after the process died (a zombie counts as dead), never for an
``orphan`` (only ``--gpu-reset`` clears that), at once after a reset.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time

# typing, imported by every node program, costs a sixth of a simulated nvidia-smi's start: the
# names are for the type checker only (mypy reads any TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    Doc = dict[str, Any]  # a JSON object
    Alloc = dict[str, Any]
    State = dict[str, Any]

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
PRUNE_AFTER_S = 300.0  # forget released allocations this long after their release


def stat_fields(pid: int) -> list[bytes] | None:
    """Return the fields of ``/proc/PID/stat`` from field 3 on (field N is ``[N - 3]``), or None.

    The one parser of that file in gpusim: comm (field 2) may hold spaces and parentheses,
    so the fields start after the last ')'.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """Return ``(state letter, ppid, start ticks)`` of ``pid``, or None if it does not exist."""
    rest = stat_fields(pid)
    if rest is None:
        return None
    return rest[3 - 3].decode(), int(rest[4 - 3]), int(rest[22 - 3])


def minor(state: State, gpu: int) -> int:
    """Return the device minor of GPU ``gpu`` (index) of a node's state."""
    return int(next((g.get("minor", gpu) for g in state["gpus"] if g["index"] == gpu), gpu))


def start_ticks(pid: int) -> int | None:
    """Return the kernel start time of ``pid`` (clock ticks after boot), or None."""
    st = proc_stat(pid)
    return None if st is None else st[2]


def is_alive(pid: int, ticks: int) -> bool:
    """Tell whether the process ``(pid, ticks)`` still runs (a zombie or a reused pid: no)."""
    st = proc_stat(pid)
    return st is not None and st[2] == ticks and st[0] not in ("Z", "X", "x")


def signal_if(pid: int | None, ticks: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process started at ``ticks``; tell if sent.

    The pid is pinned with a pidfd before its start time is checked: a reused pid is never hit.
    """
    if pid is None or ticks is None:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if start_ticks(pid) != ticks:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def cmdline_name(pid: int) -> str | None:
    """Return argv[0] of ``pid`` as the process shows it, or None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.split(b"\0", 1)[0].decode(errors="replace") or None


@contextlib.contextmanager
def locked(node_dir: str) -> Iterator[None]:
    """Hold the node's state lock (exclusive) for the duration of the block."""
    fd = os.open(os.path.join(node_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def load(node_dir: str) -> State:
    """Read the node's state (call with the lock held)."""
    with open(os.path.join(node_dir, STATE_FILE), encoding="utf-8") as f:
        state: State = json.load(f)
    return state


def save(node_dir: str, state: State) -> None:
    """Replace the node's state atomically (call with the lock held)."""
    tmp = os.path.join(node_dir, f".state.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, separators=(",", ":"))
    # Workloads may run as other users: the file must stay writable by all of them.
    os.chmod(tmp, 0o666)
    os.replace(tmp, os.path.join(node_dir, STATE_FILE))


@contextlib.contextmanager
def transaction(node_dir: str) -> Iterator[State]:
    """Lock, load, let the block change the state, and save it if it changed."""
    with locked(node_dir):
        state = load(node_dir)
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            save(node_dir, state)


def released_at(a: Alloc, delay_s: float) -> float | None:
    """Return when the allocation's memory is (or was) released, None while it is held."""
    if a.get("reset_at") is not None:
        return float(a["reset_at"])
    if a.get("died_at") is None or a.get("orphan"):
        return None
    return float(a["died_at"]) + delay_s


def refresh(state: State, now: float) -> bool:
    """Record deaths nobody recorded yet (at ``now``) and prune old records; True if changed."""
    changed = False
    delay = float(state["release_delay_s"])
    keep: list[Alloc] = []
    # Only root sees every process in /proc (hidepid hides others' from other users); a caller
    # that may not leaves deaths to the fleet's driver thread, as NVML answers from the driver.
    sees_all = os.geteuid() == 0
    for a in state["allocs"]:
        if a.get("died_at") is None and sees_all and not is_alive(a["pid"], a["start_ticks"]):
            a["died_at"] = now
            changed = True
        rel = released_at(a, delay)
        if rel is not None and now - rel > PRUNE_AFTER_S:
            changed = True
            continue
        keep.append(a)
    state["allocs"] = keep
    return changed


def report(state: State, now: float) -> dict[str, Any]:
    """Refresh ``state`` (at ``now``) and describe it as ``SimNode.state()`` reports it: the
    release delay, the fault, every GPU with its usage and every allocation."""
    refresh(state, now)
    usage = gpu_usage(state, now)
    return {
        "release_delay_s": state["release_delay_s"],
        "fault": state["fault"],
        "gpus": [
            {
                "index": g["index"],
                "uuid": g["uuid"],
                "name": g["name"],
                "bus_id": g["bus_id"],
                "memory_total_mib": g["memory_total"],
                "memory_used_mib": usage[g["index"]][0],
                "utilization_pct": usage[g["index"]][1],
            }
            for g in state["gpus"]
        ],
        "allocations": [view(a, state, now) for a in state["allocs"]],
    }


def view(a: Alloc, state: State, now: float) -> dict[str, Any]:
    """Describe one allocation as ``SimNode.state()`` reports it."""
    rel = released_at(a, float(state["release_delay_s"]))
    alive = a.get("died_at") is None and is_alive(a["pid"], a["start_ticks"])
    return {
        "pid": a["pid"],
        "start_ticks": a["start_ticks"],
        "gpu": a["gpu"],
        "mib": a["mib"],
        "util_pct": a["util"],
        "behaviour": a["behaviour"],
        "name": a["name"],
        "user": a["user"],
        "supervisor_pid": a.get("supervisor"),
        "alive": alive,
        "died_at": a.get("died_at"),
        "released": rel is not None and now >= rel,
        "released_at": rel,
        "hidden": bool(a.get("hidden")),
        "orphan": bool(a.get("orphan")),
    }


def holds_memory(a: Alloc, state: State, now: float) -> bool:
    """Tell whether the allocation's memory still counts as used on its GPU."""
    if a["gpu"] is None:
        return False
    rel = released_at(a, float(state["release_delay_s"]))
    return rel is None or now < rel


def listed(a: Alloc) -> bool:
    """Tell whether ``--query-compute-apps`` lists the allocation's process (it must be alive)."""
    return a["gpu"] is not None and a.get("died_at") is None and not a.get("hidden")


def gpu_usage(state: State, now: float) -> dict[int, tuple[int, int]]:
    """Return ``{gpu index: (used MiB, utilisation %)}`` derived from the allocations."""
    out = {g["index"]: (0, 0) for g in state["gpus"]}
    for a in state["allocs"]:
        gpu = a["gpu"]
        if gpu is None or gpu not in out:
            continue
        used, util = out[gpu]
        if holds_memory(a, state, now):
            used += int(a["mib"])
        if a.get("died_at") is None:
            util = min(100, util + int(a["util"]))
        out[gpu] = (used, util)
    return out


def new_state(
    node: str,
    gpus: list[dict[str, Any]],
    dev_prefix: str,
    release_delay_s: float,
) -> State:
    """Build the initial state of a node."""
    return {
        "node": node,
        "driver_version": "550.127.05",
        "cuda_version": "12.4",
        "dev_prefix": dev_prefix,
        "gpus": gpus,
        "release_delay_s": release_delay_s,
        "allocs": [],
        "fault": {"kind": None},
        "overrides": {"gpu": {}, "apps": {}},
        "created_at": time.time(),
    }
