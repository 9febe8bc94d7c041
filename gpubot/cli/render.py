"""Plain-text and JSON renderings of snapshots and reset results (the terminal's).

Text a node user controls goes through ``one_line`` before any colour is added, so a newline or
escape sequence in it can neither forge a line of the table nor drive the terminal.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpubot.core.flags import flags_of, node_notes, process_flags
from gpubot.core.models import NodeSnapshot, Outcome
from gpubot.core.probe.holders import NOT_CHECKED
from gpubot.core.reset.outcome import ALREADY_FREE, already_free
from gpubot.core.slurm import SLURM, alloc
from gpubot.core.text import cut, one_line
from gpubot.core.text_table import WIDTH as WIDTH  # a note's width, for the tests
from gpubot.core.text_table import (
    gpu_lines,
    node_heading,
    note_lines,
    num,
    summary_lines,
    summary_rows,
    telemetry_lines,
)

if TYPE_CHECKING:  # types only: ``gpubot status`` need not import the reset service
    from collections.abc import Sequence

    from gpubot.core.reset.plan import ResetPlan
    from gpubot.core.text_table import Paint
    from gpubot.services.reset import ResetResult
    from gpubot.services.status import FleetStatus

RED, GREEN, YELLOW, BOLD, RESET = "\033[31m", "\033[32m", "\033[33m", "\033[1m", "\033[0m"
FLAGS_COLUMN, STATUS_COLUMN = 5, 5  # of the GPU table, of the summary (``core.text_table``)


def _c(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color and text else text


def _paint(column: int, ok: str | None, color: bool) -> Paint | None:
    """Colour ``column``'s cells red (header and ``ok`` cells aside); None off a colour TTY."""

    def paint(row: int, col: int, cell: str) -> str:
        if row == 0:
            return _c(cell, BOLD, color)
        return _c(cell, RED, color) if col == column and cell.strip() != ok else cell

    return paint if color else None


def render_snapshot(
    snap: NodeSnapshot,
    *,
    color: bool = False,
    said_once: tuple[str, ...] = (),
    width: int | None = None,
) -> list[str]:
    """Render one node's per-GPU table as wide as ``width`` allows, less the notes the fleet's
    footer says once (``said_once``)."""
    lines = [_c(node_heading(snap), BOLD, color)]
    paint = _paint(FLAGS_COLUMN, None, color)
    lines.extend(gpu_lines(snap, paint, width) if snap.gpus else ["no GPUs"])
    shown = replace(snap, notes=tuple(n for n in snap.notes if n not in said_once))
    lines.extend(_c(line, YELLOW, color) for line in note_lines(shown))
    return lines


def unchecked_footer(status: FleetStatus) -> list[str]:
    """Say once, under every table, which nodes' device files were not checked: a healthy
    node's caveat, not a warning to repeat under each one."""
    names = [s.node for s in status.snapshots if NOT_CHECKED in s.notes]
    if not names:
        return []
    where = "every node" if len(names) == len(status.snapshots) > 1 else ", ".join(names[:5])
    where += f" (+{len(names) - 5})" if len(names) > 5 and where != "every node" else ""
    text = NOT_CHECKED.replace("not checked", f"not checked on {where}", 1)
    return [*textwrap.wrap(text, WIDTH, subsequent_indent="  "), ""]


def render_fleet(status: FleetStatus, *, color: bool = False, width: int | None = None) -> str:
    """Render every node's table, then the nodes that failed with their reason."""
    out: list[str] = []
    for snap in status.snapshots:
        out.extend(render_snapshot(snap, color=color, said_once=(NOT_CHECKED,), width=width))
        out.append("")
    out.extend(unchecked_footer(status))
    if status.failed:
        out.append(_c(f"{len(status.failed)} node(s) did not answer:", RED, color))
        rows = summary_rows(
            (), status.failed, slow=status.timed_out, unreachable=status.unreachable
        )
        out.extend("  " + line for line in summary_lines([[r[0], r[5]] for r in rows])[1:])
        out.append("")
    out.append(_answered(status))
    return "\n".join(out)


def render_summary(status: FleetStatus, order: Sequence[str], *, color: bool = False) -> str:
    """Render a fleet answer as one line per node in ``order``, then how long it took."""
    rows = summary_rows(
        status.snapshots,
        status.failed,
        slow=status.timed_out,
        unreachable=status.unreachable,
        order=order,
    )
    out = summary_lines(rows, _paint(STATUS_COLUMN, "ok", color)) if len(rows) > 1 else []
    if status.telemetry:
        lines = telemetry_lines(status.telemetry)
        out += ["", *lines] if out else lines
    out += [_c(f"⚠ {one_line(n)}", YELLOW, color) for n in status.notes]
    out.append(_answered(status))
    return "\n".join(out)


def _answered(status: FleetStatus) -> str:
    ok = len(status.snapshots) + len(status.telemetry)
    prom = f" ({len(status.telemetry)} from Prometheus)" if status.telemetry else ""
    return f"{ok}/{ok + len(status.failed)} nodes answered{prom} in {status.seconds:.2f} s"


# The ``--json`` fields read straight from a GPU and from each of its processes, in order.
GPU_FIELDS = ("index", "uuid", "name", "memory_used_mib", "memory_total_mib", "utilization_pct")
PROCESS_FIELDS = (
    *("pid", "user", "ppid", "state", "start_ticks", "elapsed_s", "used_memory_mib"),
    *("process_name", "command", "visible_to_nvidia_smi", "holds_device_file", "system"),
)


def snapshot_dict(snap: NodeSnapshot) -> dict[str, Any]:
    """Return the ``--json`` form of one node that answered."""
    gpus = [
        {f: getattr(g, f) for f in GPU_FIELDS}
        | {
            "bus_id": g.bus_id,
            "device_minor": g.minor,
            "flags": list(flags_of(snap, g)),
            "health": None if g.health is None else g.health.to_dict(),
            SLURM: alloc.gpu_dict(snap, g),
            "processes": [
                {f: getattr(p, f) for f in PROCESS_FIELDS}
                | {
                    "flags": list(process_flags(p)),
                    "workload": p.workload.to_dict() if p.workload else None,
                }
                for p in snap.on_gpu(g.index)
            ],
        }
        for g in snap.gpus
    ]
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
    doc: dict[str, Any] = {"nodes": [by_name[n] for n in order if n in by_name]}
    if status.telemetry or status.notes:  # a summary that read Prometheus
        doc["prometheus"] = [n.to_dict() for n in status.telemetry]
        doc["notes"] = list(status.notes)
    doc["seconds"] = status.seconds
    return doc


OUTCOME_COLOR = {Outcome.FREED: GREEN, Outcome.UNKNOWN: YELLOW}


def render_reset(result: ResetResult, *, color: bool = False) -> str:
    lines = [_c(f"reset of {result.node}", BOLD, color)]
    signalled = {i for t in result.plan.targets for i in t.gpus}
    for g in result.gpus:
        if already_free(g, g.index in signalled):  # not "freed (0 → 0 MiB)"
            word = _c(ALREADY_FREE, GREEN, color)
            lines.append(f"  GPU {g.index}: {word} ({num(g.memory_after_mib)} MiB)")
            continue
        took = "" if g.seconds_to_free is None else f" in {g.seconds_to_free:.2f} s"
        word = _c(str(g.outcome), OUTCOME_COLOR.get(g.outcome, RED), color)
        lines.append(
            f"  GPU {g.index}: {word}{took}  "
            f"({num(g.memory_before_mib)} → {num(g.memory_after_mib)} MiB) {one_line(g.detail)}"
        )
    if result.after is not None:
        lines.append("")
        lines.extend(render_snapshot(result.after, color=color))
    return "\n".join(lines)


def render_plan_lines(plan: ResetPlan) -> list[str]:
    lines = [f"plan for {plan.node}, GPU {', '.join(map(str, plan.gpus)) or '-'}:"]
    if not plan.targets:
        lines.append("  no process to signal")
    for t in plan.targets:
        lines.append(
            f"  kill {t.owner or t.user or '?'}:{t.pid} "
            f"{'memory unknown' if t.mib is None else f'{t.mib} MiB'} on GPU "
            f"{','.join(map(str, t.gpus))}: {cut(t.command, 50)} ({'; '.join(t.reasons)})"
        )
    for s in plan.skipped:
        lines.append(f"  leave {s.user or '?'}:{s.pid} on GPU {s.gpu}: {s.reason}")
    if plan.reason:
        lines.append(f"  because: {plan.reason}")
    if plan.forced:
        lines.append(f"  FORCED: kills processes of {', '.join(plan.owners)}")
    return [one_line(line) for line in lines]
