"""Status as messages: a node's per-GPU table, a fleet answer, and a process's label."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from gpubot.chat.layout import (
    FEW_NODES,
    MAX_FLAGGED,
    MAX_PARTS,
    MAX_TABLE_ROWS,
    Budget,
    clip,
    rows_of,
    table_fits,
)
from gpubot.chat.message import (
    Code,
    Date,
    Heading,
    Message,
    Section,
    Sentence,
    Table,
    Text,
    bold,
    ctx,
    italic,
)
from gpubot.core.flags import flags_of, node_notes, owner_label, process_flags, workload_label
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.telemetry import PromNode
from gpubot.core.text_table import (
    gpu_lines,
    node_text,
    num,
    program_and_args,
    summary_lines,
    summary_rows,
    telemetry_lines,
    telemetry_rows,
)
from gpubot.services.status import FleetStatus


def _gib(mib: int) -> str:
    return f"{mib / 1024:.0f} GiB" if mib >= 10240 else f"{mib} MiB"


def proc_label(p: GpuProcess) -> str:
    """Return ``user pid MiB command [flags]`` for one process (not escaped)."""
    if p.system:
        return f"system: {p.process_name} ({p.pid})"
    flags = process_flags(p)
    tail = f" [{', '.join(flags)}]" if flags else ""
    mib, command = num(p.used_memory_mib), clip(program_and_args(p), 32)
    return f"{owner_label(p)} {p.pid} {mib} MiB {workload_label(p)}{command}{tail}"


def _mem(g: GpuInfo) -> str:
    return f"{num(g.memory_used_mib)} / {num(g.memory_total_mib)} MiB"


def node_rows(snap: NodeSnapshot, *, max_procs: int = 4) -> list[list[str]]:
    """Return the table rows of one node: header, then one row per GPU."""
    rows = [["GPU", "Memory", "Util", "Processes (owner pid MiB workload command)", "Flags"]]
    for g in snap.gpus:
        procs = snap.on_gpu(g.index)
        labels = [proc_label(p) for p in procs[:max_procs]]
        if len(procs) > max_procs:
            labels.append(f"+{len(procs) - max_procs} more")
        rows.append(
            [
                str(g.index),
                _mem(g),
                "?" if g.utilization_pct is None else f"{g.utilization_pct} %",
                "; ".join(labels) or "–",
                ", ".join(flags_of(snap, g)) or "–",
            ]
        )
    return rows


def add_gpus(b: Budget, snap: NodeSnapshot, *, use_table: bool = True) -> int:
    """Add a node's GPU table (Slack's rows, and the text layout's lines) where it fits, else its
    lines (``text_table``, the one text layout); return how many lines did not fit."""
    rows = node_rows(snap)
    if use_table and table_fits(rows):
        b.add(Table(rows_of(rows), wrap=(3, 4), lines=tuple(gpu_lines(snap))))
        return 0
    lines = node_text(snap)[1:]
    return len(lines) - b.add_pre(lines, reserve=1)


Counts = tuple[int, int, int, int]  # GPUs total, busy, idle, flagged


def _counts(snaps: Sequence[NodeSnapshot]) -> Counts:
    """Return GPUs total, busy, idle, flagged."""
    total = busy = flagged = 0
    for s in snaps:
        for g in s.gpus:
            procs = s.on_gpu(g.index)
            total += 1
            busy += any(not p.system for p in procs)  # a daemon on it is not a job
            flagged += bool(flags_of(s, g))
    return total, busy, total - busy, flagged


def _taken(snaps: Sequence[NodeSnapshot]) -> Text:
    return ("taken ", Date(min(s.taken_at for s in snaps))) if snaps else ()


def render_node(snap: NodeSnapshot, *, use_table: bool = True) -> Message:
    """Render one node's GPUs: a table block where it fits, else preformatted text."""
    total, busy, idle, flagged = _counts([snap])
    summary = f"{snap.node}: {total} GPUs, {busy} busy, {idle} idle, {flagged} flagged"
    b = Budget()
    name = snap.gpus[0].name if snap.gpus else "no GPUs"
    b.add(Heading(f"{snap.node} · {len(snap.gpus)} × {name}"))
    if not snap.gpus:
        b.add(Section((italic("no GPUs found"),)))
    elif missing := add_gpus(b, snap, use_table=use_table):
        b.add(ctx(f"… {missing} more lines not shown"))
    notes = node_notes(snap)
    if notes:
        b.add(ctx(*((Sentence(f"⚠ {clip(n, 400)}"),) for n in notes[:5])))
    b.add(ctx(f"{busy} busy · {idle} idle · {flagged} flagged", _taken([snap])))
    return b.message(summary)


def render_fleet(
    snapshots: Sequence[NodeSnapshot],
    failed: Mapping[str, str],
    *,
    seconds: float = 0.0,
    title: str = "GPU status",
    use_table: bool = True,
    limit: int = MAX_PARTS,
    telemetry: Sequence[PromNode] = (),
    notes: Sequence[str] = (),
) -> Message:
    """Render several nodes: a summary, failing nodes, and details only where needed; a
    summary's nodes read from Prometheus (``telemetry``) one row each, with each one's age of
    data, and ``notes`` (why nodes were read over SSH instead) one line each."""
    if len(snapshots) == 1 and not failed and not telemetry:
        return render_node(snapshots[0], use_table=use_table)
    per = [_counts([s]) for s in snapshots]  # each node's once: the table sorts by them
    total, busy, idle, flagged = (sum(c[i] for c in per) for i in range(4))
    ok, bad = len(snapshots) + len(telemetry), len(failed)
    summary = (
        f"{title}: {ok} node(s) OK, {bad} failing · {total} GPUs: {busy} busy, {idle} idle, "
        f"{flagged} flagged" + _prom_summary(telemetry)
    )
    b = Budget(limit)
    b.add(Heading(title))
    nodes = (bold("Nodes:"), f" {ok} OK, {bad} failing    ")
    gpus = bold("GPUs over SSH:" if telemetry else "GPUs:")  # Prometheus's: their own section
    b.add(Section((*nodes, gpus, f" {busy} busy, {idle} idle, {flagged} flagged")))
    tail = 2  # room kept for "more not shown" and the context line
    for n in notes:
        b.add(ctx(f"⚠ {clip(n, 400)}"))
    if failed:
        lines = [f"{n}: {why}" for n, why in failed.items()]
        b.add(Section((bold(f"{bad} node(s) did not answer:"),)))
        shown = b.add_pre(lines[:60], reserve=tail + 2)
        if shown < bad:
            b.add(ctx(f"… and {bad - shown} more failing node(s)"))
    if telemetry:
        _add_prometheus(b, telemetry, use_table=use_table, tail=tail)
    if len(snapshots) <= FEW_NODES:
        for s in snapshots:
            lines = node_text(s)
            if b.add_pre(lines, reserve=tail) < len(lines):
                break
    else:
        _add_many(b, list(zip(snapshots, per, strict=True)), use_table=use_table, tail=tail)
    b.add(ctx(f"{ok + bad} node(s) asked in {seconds:.1f} s", _taken(snapshots)))
    return b.message(summary)


def _prom_summary(telemetry: Sequence[PromNode]) -> str:
    """The fallback line's part for the nodes read from Prometheus."""
    if not telemetry:
        return ""
    gpus = sum(len(n.gpus) for n in telemetry)
    used = sum(1 for n in telemetry for g in n.gpus if g.used_mib)
    return f" · from Prometheus: {len(telemetry)} node(s), {gpus} GPUs, {used} holding memory"


def _add_prometheus(
    b: Budget, telemetry: Sequence[PromNode], *, use_table: bool, tail: int
) -> None:
    """Add the nodes read from Prometheus, one row each (``text_table.telemetry_rows``, the
    CLI's), those whose DCGM saw an Xid first, then the oldest data; the rest counted."""
    order = sorted(telemetry, key=lambda n: (not any(g.last_xid for g in n.gpus), -n.age_s))
    gpus = sum(len(n.gpus) for n in telemetry)
    oldest = max(n.age_s for n in telemetry)
    said = f"From Prometheus: {len(telemetry)} node(s), {gpus} GPUs, data up to {oldest:.0f} s old"
    b.add(Section((bold(said),)))
    rows = telemetry_rows(order[: MAX_TABLE_ROWS - 1])
    if use_table and table_fits(rows):
        text = telemetry_lines(order[: MAX_TABLE_ROWS - 1])
        b.add(Table(rows_of(rows), right=(1, 2, 3, 4, 6), lines=tuple(text)))
        listed = len(rows) - 1
    else:
        listed = max(0, b.add_pre(telemetry_lines(order), reserve=tail + 3) - 1)
    hint = ("holders: ", Code("/gpu status NODE"), " (read on the node)")
    if len(telemetry) > listed:
        b.add(ctx((f"{listed} of {len(telemetry)} nodes listed, Xids first; ", *hint)))
    else:
        b.add(ctx(hint))


class FleetRenders:
    """Renders each fleet answer once per title, keeping the last ``keep`` messages: requests
    that joined one round of probes share one ``FleetStatus``, so a burst is rendered once. Keyed
    on the answer's identity (held, so its id is not reused while kept); a message is shared, so
    never changed afterwards."""

    keep = 8

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[int, str], tuple[FleetStatus, Message]] = OrderedDict()

    def fleet(self, answer: FleetStatus, title: str) -> Message:
        """Return ``answer`` rendered with ``title`` (``render_fleet``), rendering it once."""
        key = (id(answer), title)
        hit = self._kept.get(key)
        if hit is not None and hit[0] is answer:
            return hit[1]
        msg = render_fleet(
            answer.snapshots,
            answer.failed,
            seconds=answer.seconds,
            title=title,
            telemetry=answer.telemetry,
            notes=answer.notes,
        )
        self._kept[key] = (answer, msg)
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        return msg


def _add_many(
    b: Budget, counted: Sequence[tuple[NodeSnapshot, Counts]], *, use_table: bool, tail: int
) -> None:
    """Add a one-row-per-node table (flagged first), then the flagged GPUs' lines."""
    rows = [["Node", "GPUs busy", "Memory used", "Flagged"]]
    snapshots = [s for s, _ in counted]
    order = sorted(counted, key=lambda sc: -sc[1][3])
    for s, (_, sb, _, sf) in order[: MAX_TABLE_ROWS - 1]:
        used = sum(g.memory_used_mib or 0 for g in s.gpus)
        cap = sum(g.memory_total_mib or 0 for g in s.gpus)
        rows.append([s.node, f"{sb}/{len(s.gpus)}", f"{_gib(used)} / {_gib(cap)}", str(sf)])
    text = summary_lines(summary_rows([s for s, _ in order[: MAX_TABLE_ROWS - 1]]))
    if use_table and table_fits(rows):
        b.add(Table(rows_of(rows), right=(1, 2, 3), lines=tuple(text)))
        listed = len(rows) - 1
    else:  # the summary as aligned text (the Home tab, or a table that would not fit)
        listed = max(0, b.add_pre(text, reserve=tail + 3) - 1)
    if len(snapshots) > listed:
        b.add(ctx(f"{listed} of {len(snapshots)} nodes listed, flagged first"))
    flagged_lines = _flagged_lines(snapshots)
    if flagged_lines:
        b.add(Section((bold(f"Flagged GPUs ({len(flagged_lines)}):"),)))
        shown = b.add_pre(flagged_lines[:MAX_FLAGGED], reserve=tail)
        if shown < len(flagged_lines):
            more = f"… and {len(flagged_lines) - shown} more flagged GPU(s): use "
            b.add(ctx((more, Code("/gpu status NODE"), " for one node")))


def _flagged_lines(snaps: Sequence[NodeSnapshot]) -> list[str]:
    out = []
    for s in snaps:
        for g in s.gpus:
            procs = s.on_gpu(g.index)
            flags = flags_of(s, g)
            if flags:
                who = ", ".join(sorted({p.user or "?" for p in procs})) or "no process"
                out.append(f"{s.node} GPU {g.index}: {_mem(g)}  {', '.join(flags)}  ({who})")
    return out
