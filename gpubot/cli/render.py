"""Plain-text and JSON renderings of snapshots and reset results (terminal and console).

Text a node user controls (commands, names, user names, notes, reasons) is written through
``one_line`` before any colour is added: a newline, carriage return or escape sequence in it is
shown as ``\\xNN``, so it can neither forge a line of the table nor drive the terminal.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from gpubot.core.flags import gpu_flags, node_notes, owner_label, process_flags, workload_label
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot, Outcome
from gpubot.core.text import one_line

if TYPE_CHECKING:  # types only: ``gpubot status`` need not import the reset service
    from gpubot.core.plan import ResetPlan
    from gpubot.services.reset import ResetResult
    from gpubot.services.status import FleetStatus

WIDTH = 100
RED, GREEN, YELLOW, BOLD, RESET = "\033[31m", "\033[32m", "\033[33m", "\033[1m", "\033[0m"


def _c(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color and text else text


def _num(v: int | None) -> str:
    return "?" if v is None else str(v)


def _mem(g: GpuInfo) -> str:
    pct = ""
    if g.memory_used_mib is not None and g.memory_total_mib:
        pct = f"{100 * g.memory_used_mib // g.memory_total_mib:>3d}%"
    return f"{_num(g.memory_used_mib):>6} / {_num(g.memory_total_mib):<6} {pct:>4}"


def process_label(p: GpuProcess) -> str:
    """Return ``user:pid:MiB command`` for one process (``system: name`` for a daemon)."""
    if p.system:
        return one_line(f"system: {p.process_name} ({p.pid})")
    cmd = (p.command or p.process_name).strip()
    return one_line(f"{owner_label(p)}:{p.pid}:{_num(p.used_memory_mib)} {workload_label(p)}{cmd}")


def render_snapshot(snap: NodeSnapshot, *, color: bool = False) -> list[str]:
    """Render one node's per-GPU table, at most ``WIDTH`` columns."""
    name = snap.gpus[0].name if snap.gpus else "no GPUs"
    lines = [_c(one_line(f"{snap.node} · {len(snap.gpus)} × {name}"), BOLD, color)]
    procs_head = "PROCESSES (owner:pid:MiB workload command)"
    lines.append(f"{'GPU':>3}  {'MEMORY MiB':<19}  {'UTIL':>4}  {procs_head:<48} FLAGS")
    for g in snap.gpus:
        procs = snap.on_gpu(g.index)
        flags = " ".join(gpu_flags(g, procs))
        util = "?" if g.utilization_pct is None else f"{g.utilization_pct}%"
        head = f"{g.index:>3}  {_mem(g):<19}  {util:>4}  "
        labels = [process_label(p) for p in procs] or ["-"]
        for i, label in enumerate(labels):
            pflags = " ".join(process_flags(procs[i])) if procs else ""
            text = (head if i == 0 else " " * len(head)) + f"{label[:48]:<48}"
            tail = flags if i == 0 else pflags
            if i == 0 and pflags and pflags not in tail:
                tail = f"{tail} {pflags}".strip()
            code = RED if tail else ""
            lines.append((text + " " + _c(tail, code, color)).rstrip()[: WIDTH + 10])
    lines.extend(_c(line, YELLOW, color) for n in node_notes(snap) for line in _wrap(one_line(n)))
    return lines


def _wrap(note: str) -> list[str]:
    """Return a note as ``  ! `` lines that fit ``WIDTH`` (the first 6 of them)."""
    return textwrap.wrap(note, WIDTH, initial_indent="  ! ", subsequent_indent="    ")[:6]


def render_fleet(status: FleetStatus, *, color: bool = False) -> str:
    """Render a fleet answer: every node's table, then the nodes that failed with their reason."""
    out: list[str] = []
    for snap in status.snapshots:
        out.extend(render_snapshot(snap, color=color))
        out.append("")
    if status.failed:
        out.append(_c(f"{len(status.failed)} node(s) did not answer:", RED, color))
        out.extend(one_line(f"  {n:<16} {r}") for n, r in status.failed.items())
        out.append("")
    ok = len(status.snapshots)
    out.append(f"{ok}/{ok + len(status.failed)} nodes answered in {status.seconds:.2f} s")
    return "\n".join(out)


def snapshot_dict(snap: NodeSnapshot) -> dict[str, Any]:
    """Return the ``--json`` form of one node that answered."""
    gpus = []
    for g in snap.gpus:
        procs = snap.on_gpu(g.index)
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "utilization_pct": g.utilization_pct,
                "bus_id": g.bus_id,
                "device_minor": g.minor,
                "flags": list(gpu_flags(g, procs)),
                "health": None if g.health is None else g.health.to_dict(),
                "processes": [
                    {
                        "pid": p.pid,
                        "user": p.user,
                        "ppid": p.ppid,
                        "state": p.state,
                        "start_ticks": p.start_ticks,
                        "elapsed_s": p.elapsed_s,
                        "used_memory_mib": p.used_memory_mib,
                        "process_name": p.process_name,
                        "command": p.command,
                        "visible_to_nvidia_smi": p.visible_to_nvidia_smi,
                        "holds_device_file": p.holds_device_file,
                        "system": p.system,
                        "flags": list(process_flags(p)),
                        "workload": p.workload.to_dict() if p.workload else None,
                    }
                    for p in procs
                ],
            }
        )
    return {
        "name": snap.node,
        "ok": True,
        "error": None,
        "taken_at": snap.taken_at,
        "gpus": gpus,
        "notes": list(node_notes(snap)),
        "lost": list(snap.lost),
    }


def fleet_dict(status: FleetStatus, order: list[str]) -> dict[str, Any]:
    """Return the ``--json`` document of a fleet answer, nodes in ``order``."""
    by_name = {s.node: snapshot_dict(s) for s in status.snapshots}
    for name, why in status.failed.items():
        by_name[name] = {"name": name, "ok": False, "error": why, "gpus": []}
    return {"nodes": [by_name[n] for n in order if n in by_name], "seconds": status.seconds}


OUTCOME_COLOR = {Outcome.FREED: GREEN, Outcome.UNKNOWN: YELLOW}


def render_reset(result: ResetResult, *, color: bool = False) -> str:
    """Render a reset's outcome per GPU with memory before and after."""
    lines = [_c(f"reset of {result.node}", BOLD, color)]
    for g in result.gpus:
        took = "" if g.seconds_to_free is None else f" in {g.seconds_to_free:.2f} s"
        word = _c(str(g.outcome), OUTCOME_COLOR.get(g.outcome, RED), color)
        lines.append(
            f"  GPU {g.index}: {word}{took}  "
            f"({_num(g.memory_before_mib)} → {_num(g.memory_after_mib)} MiB) {one_line(g.detail)}"
        )
    if result.after is not None:
        lines.append("")
        lines.extend(render_snapshot(result.after, color=color))
    return "\n".join(lines)


def render_plan_lines(plan: ResetPlan) -> list[str]:
    """Render a plan: each target with owner, GPUs, memory, command and reasons."""
    lines = [f"plan for {plan.node}, GPU {', '.join(map(str, plan.gpus)) or '-'}:"]
    if not plan.targets:
        lines.append("  no process to signal")
    for t in plan.targets:
        lines.append(
            f"  kill {t.owner or t.user or '?'}:{t.pid} "
            f"{'memory unknown' if t.mib is None else f'{t.mib} MiB'} on GPU "
            f"{','.join(map(str, t.gpus))}: {t.command[:50]} ({'; '.join(t.reasons)})"
        )
    for s in plan.skipped:
        lines.append(f"  leave {s.user or '?'}:{s.pid} on GPU {s.gpu}: {s.reason}")
    if plan.reason:
        lines.append(f"  because: {plan.reason}")
    if plan.forced:
        lines.append(f"  FORCED: kills processes of {', '.join(plan.owners)}")
    return [one_line(line) for line in lines]
