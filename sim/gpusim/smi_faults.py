"""The faults of the stand-in ``nvidia-smi``: what each is, and what a broken call does.

Standalone (standard library only, relative imports only): part of the stand-in ``nvidia-smi``
(``nvidia_smi``), which acts on the fault in the node's state; ``SimNode.set_fault`` checks one
with ``fault_record``, and finds the calls that hang or stuck copies by the marks they leave in
``<state>/run/`` (``smi-PID-TICKS``, ``stuck-PID-TICKS``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

from . import simstate

TYPE_CHECKING = False  # (no typing at run time: see simstate)
if TYPE_CHECKING:
    from typing import Any

FAULTS = ("hang", "slow", "missing", "garbled", "driver-error", "inforom", "lost", "stuck")
LOST_STYLES = ("index-bus", "bus", "index")  # the three shapes drivers print
# Foreign lines a garbled call interleaves with its own (another query's row, a warning).
GARBLE_LINES = ("1949090, 0 MiB", "WARNING: infoROM is corrupted at gpu 0000:18:00.0")


def lost_line(state: simstate.State, fault: dict[str, Any]) -> str:
    """Return what nvidia-smi prints for a GPU that fell off the bus, in the fault's shape."""
    g = state["gpus"][int(fault["gpu"])]
    bus = g["bus_id"][4:]  # "0000:18:00.0"
    head = "Unable to determine the device handle for GPU"
    shape = {"bus": f"{bus}", "index": f"{g['index']}", "index-bus": f"{g['index']}: {bus}"}
    return f"{head}{shape[fault.get('style', 'index-bus')]}: Unknown Error\n"


def garble(text: str) -> str:
    """Interleave foreign output with ``text``, as when two programs share one stream."""
    lines = text.splitlines()
    out = [*lines[:1], GARBLE_LINES[0], *lines[1:]]
    if len(lines) >= 3:  # one row cut in two by another writer
        row = out[3]
        cut = max(1, len(row) // 2)
        out[3:4] = [row[:cut] + GARBLE_LINES[1], row[cut:]]
    return "".join(line + "\n" for line in out)


def stick(node_dir: str, hold_s: float) -> None:
    """Leave a copy of this nvidia-smi behind that no kill of the caller's reaches (for hold_s).

    A real one hangs in the kernel in state D and survives SIGKILL; this one is out of reach
    instead (its own session, its own streams), with the same name and owner.
    """
    if os.fork() != 0:
        return
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)  # the caller's streams (the SSH session's) must end without it
        me = os.getpid()
        mark = os.path.join(node_dir, "run", f"stuck-{me}-{simstate.start_ticks(me)}")
        with open(mark, "w", encoding="utf-8") as f:
            f.write(f"{me}\n")
        time.sleep(hold_s)
        with contextlib.suppress(OSError):
            os.unlink(mark)
    finally:
        os._exit(0)


def hang(node_dir: str) -> None:
    """Never answer: wait until the reader goes away, the parent dies, or a signal ends us."""
    me = os.getpid()
    ticks = simstate.start_ticks(me)
    mark = os.path.join(node_dir, "run", f"smi-{me}-{ticks}")
    try:
        with open(mark, "w", encoding="utf-8") as f:
            f.write(f"{me} {ticks}\n")
    except OSError:
        mark = ""
    parent = os.getppid()
    poller = select.poll()
    try:
        out_fd = sys.stdout.fileno()
        poller.register(out_fd, select.POLLERR | select.POLLHUP)
    except (OSError, ValueError):
        pass
    try:
        while os.getppid() == parent:
            if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(250)):
                return  # the SSH session closed the pipe: nobody will read an answer
    finally:
        if mark:
            with contextlib.suppress(OSError):
                os.unlink(mark)


def fault_record(kind: str | None, params: dict[str, Any], gpus: int) -> dict[str, Any]:
    """Check a fault and its parameters (a node of ``gpus`` GPUs); return it as the state has it.

    Raise ``ValueError`` (``SimNode.set_fault`` makes it a ``SimUsageError``) for a bad one.
    """
    if kind is not None and kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r} (one of {', '.join(FAULTS)}, or none)")
    allowed = {"slow": {"delay_s"}, "lost": {"gpu", "style"}, "stuck": {"hold_s"}}.get(
        kind or "", set()
    )
    if set(params) - allowed:
        raise ValueError(f"fault {kind}: unknown parameter(s) {sorted(set(params) - allowed)}")
    fault: dict[str, Any] = {"kind": kind}
    if kind == "slow":
        delay = params.get("delay_s", 5.0)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise ValueError(f"fault slow: delay_s must be a number >= 0, not {delay!r}")
        fault["delay_s"] = float(delay)
    if kind == "stuck":
        fault["hold_s"] = float(params.get("hold_s", 60.0))
    if kind == "lost":
        gpu, style = params.get("gpu", 0), params.get("style", "index-bus")
        if not isinstance(gpu, int) or not 0 <= gpu < gpus or style not in LOST_STYLES:
            raise ValueError(f"fault lost: gpu 0-{gpus - 1}, style one of {LOST_STYLES}")
        fault.update(gpu=gpu, style=style)
    return fault


def stuck_copies(state_dir: str) -> list[tuple[int, int]]:
    """Return ``(pid, start ticks)`` of the stuck copies (fault ``stuck``) still there."""
    out = []
    for _, name in _run_files(state_dir, "stuck-"):
        with contextlib.suppress(ValueError):
            pid, ticks = (int(x) for x in name.split("-")[1:3])
            if simstate.is_alive(pid, ticks):
                out.append((pid, ticks))
    return out


def end_stuck(state_dir: str) -> None:
    """End the stuck copies (by pid and start time) and forget them."""
    for pid, ticks in stuck_copies(state_dir):
        simstate.signal_if(pid, ticks, signal.SIGKILL)
    for path, _ in _run_files(state_dir, "stuck-"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def hung_calls(state_dir: str) -> list[tuple[int, int]]:
    """Return ``(pid, start ticks)`` of the stand-in's calls that hang now; forget dead ones."""
    out = []
    for path, name in _run_files(state_dir, "smi-"):
        try:
            pid, ticks = (int(x) for x in name.split("-")[1:3])
        except ValueError:
            continue
        if simstate.is_alive(pid, ticks):
            out.append((pid, ticks))
        else:  # killed before it could clean up
            with contextlib.suppress(OSError):
                os.unlink(path)
    return out


def _run_files(state_dir: str, prefix: str) -> list[tuple[str, str]]:
    """Return ``(path, name)`` of the files in ``STATE_DIR/run`` named ``PREFIX…`` (os, not
    pathlib: pathlib's imports cost an eighth of a simulated nvidia-smi's start)."""
    run = os.path.join(state_dir, "run")
    try:
        names = os.listdir(run)
    except FileNotFoundError:
        return []
    return [(os.path.join(run, n), n) for n in sorted(names) if n.startswith(prefix)]
