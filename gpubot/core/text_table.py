"""Tables as terminal text: the one layout of ``gpubot status``, the console and the demo.

In core so that ``gpubot status`` prints without loading the chat layer (its cold start). A cell
is cut at its end (a command keeps its start); text a node user controls goes through
``one_line`` first, so it can forge no line.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from gpubot.core.flags import flags_of, node_notes, owner_label, process_flags, workload_label
from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.telemetry import PromNode
from gpubot.core.text import cut, one_line

WIDTH = 100  # a note's line; the tables below stay near it
PROCESS_MOST = 50  # the processes column: its command is cut to fit (then "…")
STATUS_MOST = 64  # the summary's status column (a failing node's reason)
FLAGS_MOST = 28  # the summary's flagged column (a count, the commonest flags)
NOTE_LINES = 6  # lines of one note, wrapped at WIDTH
GPU_HEADER = (
    "GPU",
    "MEMORY MiB",
    "MEM %",
    "UTIL",
    "PROCESSES (owner pid MiB workload command)",
    "FLAGS",
)
GPU_RIGHT = (0, 1, 2, 3)
SUMMARY_HEADER = ("NODE", "GPUS USED", "MEMORY GiB", "FLAGGED", "HOLDERS", "STATUS")
SUMMARY_RIGHT = (1, 2, 4)
PROM_HEADER = ("NODE", "GPUS", "IN USE", "MEMORY GiB", "UTIL %", "LAST XID", "DATA AGE")
PROM_RIGHT = (1, 2, 3, 4, 6)

# (row, column, the cell as padded) -> the cell as written (a terminal's colour); row 0: header
Paint = Callable[[int, int, str], str]


def table_lines(
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    most: Mapping[int, int] | None = None,
    paint: Paint | None = None,
) -> list[str]:
    """Lay out ``rows`` (header first) as columns two spaces apart, cells cut to ``most``."""
    limit = most or {}
    cells = [[cut(one_line(c), limit.get(i, 10**6)) for i, c in enumerate(r)] for r in rows]
    n = max((len(r) for r in cells), default=0)
    width = [max((len(r[i]) for r in cells if i < len(r)), default=0) for i in range(n)]
    out = []
    for y, row in enumerate(cells):
        last = max((i for i, c in enumerate(row) if c), default=-1)
        parts = []
        for i, c in enumerate(row[: last + 1]):
            padded = c.rjust(width[i]) if i in right else c if i == last else c.ljust(width[i])
            parts.append(paint(y, i, padded) if paint is not None and c else padded)
        out.append("  ".join(parts).rstrip())
    return out


def num(v: int | None) -> str:
    """Return a count as written in a table: ``?`` when not known."""
    return "?" if v is None else str(v)


def program_and_args(p: GpuProcess) -> str:
    """Return a process's command as its program's name and its arguments (not cut)."""
    cmd = (p.command or p.process_name or "?").strip()
    first, _, rest = cmd.partition(" ")
    return f"{first.rsplit('/', 1)[-1]} {rest}".strip()


def process_cell(p: GpuProcess, most: int = PROCESS_MOST) -> str:
    """Return ``owner pid MiB workload command`` of one process; only the command is cut."""
    if p.system:
        return f"system: {p.process_name} ({p.pid})"
    head = f"{owner_label(p)} {p.pid} {num(p.used_memory_mib)} MiB {workload_label(p)}"
    return head + cut(program_and_args(p), max(12, most - len(head)))


def gpu_rows(snap: NodeSnapshot, width: int | None = None) -> list[list[str]]:
    """Return a node's GPU rows, header first; each further process on a row of its own."""
    rows = [list(GPU_HEADER)]
    held: list[GpuProcess | None] = []  # each row's process, its cell written once all are known
    for g in snap.gpus:
        procs = snap.on_gpu(g.index)
        used, total = g.memory_used_mib, g.memory_total_mib
        memory = f"{num(used)} / {num(total)}"
        pct = "?" if used is None or not total else f"{100 * used // total}%"
        util = "?" if g.utilization_pct is None else f"{g.utilization_pct}%"
        rows.append([str(g.index), memory, pct, util, "", ", ".join(flags_of(snap, g))])
        held.append(procs[0] if procs else None)
        for more in procs[1:]:
            rows.append(["", "", "", "", "", ", ".join(process_flags(more))])
            held.append(more)
    most = process_most(rows, width)
    for row, p in zip(rows[1:], held, strict=True):
        row[4] = process_cell(p, most) if p is not None else "–"
    return rows


def process_most(rows: Sequence[Sequence[str]], width: int | None) -> int:
    """Return what a ``width`` line leaves the processes column, never under ``PROCESS_MOST``."""
    if width is None:
        return PROCESS_MOST
    others = sum(max(len(one_line(r[i])) for r in rows) for i in (0, 1, 2, 3))
    flags = max(len(one_line(r[5])) for r in rows)  # the header's FLAGS is always written
    return max(PROCESS_MOST, width - others - flags - 2 * (len(GPU_HEADER) - 1))


def gpu_lines(
    snap: NodeSnapshot, paint: Paint | None = None, width: int | None = None
) -> list[str]:
    return table_lines(gpu_rows(snap, width), right=GPU_RIGHT, paint=paint)


def node_heading(snap: NodeSnapshot) -> str:
    """Return ``node · N × model``: the line above a node's table."""
    name = snap.gpus[0].name if snap.gpus else "no GPUs"
    return one_line(f"{snap.node} · {len(snap.gpus)} × {name}")


def note_lines(snap: NodeSnapshot) -> list[str]:
    """Return the node's notes as ``⚠ `` lines that fit ``WIDTH`` (``NOTE_LINES`` of each)."""
    out: list[str] = []
    for note in node_notes(snap):
        wrapped = textwrap.wrap(one_line(note), WIDTH, initial_indent="⚠ ", subsequent_indent="  ")
        out.extend(wrapped[:NOTE_LINES])
    return out


def node_text(snap: NodeSnapshot) -> list[str]:
    table = gpu_lines(snap) if snap.gpus else ["no GPUs found"]
    return [node_heading(snap), *table, *note_lines(snap)]


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def summary_row(snap: NodeSnapshot) -> list[str]:
    """Return one answering node's summary: GPUs in use, memory, flags, holders, status."""
    used = cap = busy = flagged = holders = 0
    unknown = False
    counts: Counter[str] = Counter()
    for g in snap.gpus:
        procs = snap.on_gpu(g.index)
        jobs = [p for p in procs if not p.system]
        busy += bool(jobs)
        holders += len(jobs)
        flags = flags_of(snap, g)
        flagged += bool(flags)
        counts.update(flags)
        unknown = unknown or g.memory_used_mib is None or g.memory_total_mib is None
        used += g.memory_used_mib or 0
        cap += g.memory_total_mib or 0
    top = [f for f, _ in counts.most_common(2)]
    more = f" +{len(counts) - 2}" if len(counts) > 2 else ""
    mem = f"{_gib(used)} / {_gib(cap)}" + ("?" if unknown else "")
    flag_cell = f"{flagged} {', '.join(top)}{more}" if flagged else "0"
    return [snap.node, f"{busy}/{len(snap.gpus)}", mem, flag_cell, str(holders), "ok"]


def summary_rows(
    snaps: Sequence[NodeSnapshot],
    failed: Mapping[str, str] | None = None,
    *,
    slow: Sequence[str] = (),
    unreachable: Sequence[str] = (),
    order: Sequence[str] | None = None,
) -> list[list[str]]:
    """Return the header and a row per node; one that did not answer shows ``slow``,
    ``unreachable`` or ``failed``."""
    rows = {s.node: summary_row(s) for s in snaps}
    for name, why in (failed or {}).items():
        state = "slow" if name in slow else "unreachable" if name in unreachable else "failed"
        rows[name] = [name, "?", "?", "?", "?", f"{state}: {why}"]
    names = [n for n in order if n in rows] if order is not None else list(rows)
    return [list(SUMMARY_HEADER), *(rows[n] for n in names)]


def summary_lines(rows: Sequence[Sequence[str]], paint: Paint | None = None) -> list[str]:
    return table_lines(rows, right=SUMMARY_RIGHT, most={3: FLAGS_MOST, 5: STATUS_MOST}, paint=paint)


def telemetry_row(n: PromNode) -> list[str]:
    """Return one node read from Prometheus: GPUs, those holding memory, memory, mean
    utilisation, the last Xid DCGM saw, and the age of its oldest GPU's data."""
    used = [g.used_mib for g in n.gpus if g.used_mib is not None]
    totals = [g.total_mib for g in n.gpus if g.total_mib is not None]
    utils = [g.utilization_pct for g in n.gpus if g.utilization_pct is not None]
    xids = sorted({g.last_xid for g in n.gpus if g.last_xid is not None})
    unknown = "?" if len(totals) < len(n.gpus) else ""
    return [
        one_line(n.node),
        str(len(n.gpus)),
        str(sum(1 for u in used if u > 0)),
        f"{sum(used) / 1024:.1f} / {sum(totals) / 1024:.1f}{unknown}",
        f"{sum(utils) / len(utils):.0f}" if utils else "?",
        ", ".join(map(str, xids)) or "-",
        f"{n.age_s:.0f} s",
    ]


def telemetry_rows(nodes: Sequence[PromNode]) -> list[list[str]]:
    """Return the header and a row per node read from Prometheus (``telemetry_row``)."""
    return [list(PROM_HEADER), *(telemetry_row(n) for n in nodes)]


def telemetry_lines(nodes: Sequence[PromNode]) -> list[str]:
    return table_lines(telemetry_rows(nodes), right=PROM_RIGHT)
