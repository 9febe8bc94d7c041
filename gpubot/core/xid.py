"""Xid and SXid events → findings with the next step (pure: time passed in).

An event maps to its GPU through the bus ids of the node's snapshot (nvidia-smi's
``pci.bus_id``, as ``core.kernlog.gpu_bus`` writes it); an Xid whose bus id no GPU of the
snapshot has is the node's finding, saying so, and an SXid is always the node's (it names an
NVSwitch). Each (GPU, code) is one finding while an event of it lies in the window (``window_s``):
it alerts once, and resolves once the window has passed with none. A code with a repeat threshold
(``XidClass.burst``) seen that often in the window on one GPU is a second finding, for on-call,
with the class's burst step: an Xid 13 once is its job's owner's, five in an hour are not.

Never trusted: the pid and name in a line are the kernel's copy of what a user controls. They
appear in the summary marked (``core.text.code``: one line, escaped by every front end) and
decide nothing; the owner told of an application Xid is the user of the process that holds the
GPU under that pid in the same sweep's snapshot, as ``/proc`` says, never the line's name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpubot.core.findings import Finding
from gpubot.core.kernlog import XidEvent, gpu_bus
from gpubot.core.models import FindingKind, NodeSnapshot
from gpubot.core.text import code as mark
from gpubot.core.xid_table import QUIET, TELL_OWNER, XidClass, sxid_class, xid_class

DEFAULT_WINDOW_S = 3600.0


@dataclass(frozen=True)
class Seen:
    """One event as the sweep that read it saw it: when (the line's time, else the read's)."""

    node: str
    event: XidEvent
    at: float


def recent(seen: Iterable[Seen], now: float, window_s: float) -> list[Seen]:
    """Return the events within the window, oldest first."""
    return sorted((s for s in seen if now - s.at <= window_s), key=lambda s: s.at)


def bus_map(snap: NodeSnapshot) -> dict[str, int]:
    """Return the node's GPUs by bus id as an Xid line writes it."""
    out: dict[str, int] = {}
    for g in snap.gpus:
        bus = gpu_bus(g.bus_id)
        if bus is not None:
            out[bus] = g.index
    return out


def classify(e: XidEvent) -> XidClass:
    """Return the class of one event."""
    return sxid_class(e.code, e.text) if e.sxid else xid_class(e.code)


def xid_findings(
    seen: Sequence[Seen], snaps: Mapping[str, NodeSnapshot], *, now: float, window_s: float
) -> list[Finding]:
    """Return the findings of the events in the window (``seen``, of every node)."""
    groups: dict[tuple[str, int | None, bool, int, str], list[Seen]] = {}
    for s in recent(seen, now, window_s):
        e = s.event
        snap = snaps.get(s.node)
        gpu = None if e.sxid or snap is None else bus_map(snap).get(e.bus)
        bus = "" if gpu is not None else e.bus
        groups.setdefault((s.node, gpu, e.sxid, e.code, bus), []).append(s)
    out: list[Finding] = []
    for (node, gpu, _sxid, _code, bus), group in sorted(groups.items(), key=_order):
        cls = classify(group[-1].event)
        snap = snaps.get(node)
        if cls.step != QUIET:
            out.append(_finding(node, gpu, bus, group, cls, cls.step, snap, burst=False))
        if cls.burst and len(group) >= cls.burst:
            out.append(_finding(node, gpu, bus, group, cls, cls.burst_step, snap, burst=True))
    return out


def _order(item: tuple[tuple[str, int | None, bool, int, str], list[Seen]]) -> tuple[object, ...]:
    node, gpu, sxid, code, bus = item[0]
    return (node, -1 if gpu is None else gpu, sxid, code, bus)


def _finding(
    node: str,
    gpu: int | None,
    bus: str,
    group: Sequence[Seen],
    cls: XidClass,
    step: str,
    snap: NodeSnapshot | None,
    *,
    burst: bool,
) -> Finding:
    last = group[-1].event
    label = "SXid" if last.sxid else "Xid"
    kind = FindingKind.NVSWITCH_SXID if last.sxid else FindingKind.GPU_XID
    holder = (
        f"{label.lower()}:{cls.code}" + (f":{bus}" if bus else "") + (":burst" if burst else "")
    )
    where = ""
    if last.sxid:
        where = f" on the NVSwitch at {bus}"
    elif gpu is None and snap is None:
        where = f" on the GPU at {bus} (the node has given no GPU table yet)"
    elif gpu is None:
        where = f" on a GPU at {bus} that no GPU of the node's table has (its bus id is unknown)"
    times = f"{len(group)} in the window" if len(group) > 1 else "once"
    said = f" ({mark(last.text[:120])})" if last.text else ""
    who, owner = _who(last, gpu, snap)
    summary = (
        f"{label} {cls.code} {cls.name}: {cls.meaning}{where}{said}, {times}{who}; "
        f"fault: {cls.fault}; next step: {step}"
        + (f" (past the threshold of {cls.burst})" if burst else "")
    )
    return Finding(
        node,
        gpu,
        kind,
        holder,
        summary,
        owner=owner if step == TELL_OWNER else None,
        next_step=step,
    )


def _who(e: XidEvent, gpu: int | None, snap: NodeSnapshot | None) -> tuple[str, str | None]:
    """Return the words about the line's process (escaped) and the owner ``/proc`` names."""
    if e.pid is None and e.name is None:
        return "", None
    words = f"; the line names pid {mark(e.pid or '?')} {mark(e.name or '?')}"
    if snap is None or gpu is None or e.pid is None or not e.pid.isdigit():
        return words, None
    pid = int(e.pid)
    held = [p for p in snap.on_gpu(gpu) if p.pid == pid and p.exists and p.user]
    if not held:
        return words + " (no longer on the GPU)", None
    return words, held[0].user
