"""Looking at real processes from tests: states and command lines read from /proc, and polls
that wait for a state with a deadline (never a bare sleep)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def stat_fields(pid: int) -> list[str] | None:
    """Return the fields of ``/proc/PID/stat`` after the command name, or None once it is gone.

    A process reaped between ``open`` and ``read`` makes the read fail with ``ESRCH``
    (``ProcessLookupError``), not ``FileNotFoundError``: every ``OSError`` means gone, as does a
    file read empty or cut short.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    return fields if paren and len(fields) > 19 else None


def state(pid: int) -> str | None:
    """Return the state letter of ``pid`` (``R``, ``S``, ``D``, ``Z`` ...), or None once gone."""
    fields = stat_fields(pid)
    return None if fields is None else fields[0]


def start_ticks(pid: int) -> int:
    """Return the start time of ``pid`` in clock ticks (the process must exist)."""
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return int(fields[19])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead: its files are closed)."""
    return state(pid) not in (None, "Z", "X")


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.02
) -> None:
    """Poll ``check`` until it holds; fail with ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(step_s)


async def until(
    check: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.02
) -> None:
    """Like ``wait_until``, without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(step_s)


def wait_zombie(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until ``pid`` (a child of this test, not reaped yet) is a zombie."""
    wait_until(lambda: state(pid) == "Z", timeout_s, f"pid {pid} to become a zombie (state Z)")


def wait_dead(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until ``pid`` is a zombie or gone from /proc."""
    wait_until(lambda: not alive(pid), timeout_s, f"pid {pid} to die")


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
