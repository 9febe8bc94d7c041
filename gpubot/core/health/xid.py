"""Xid and SXid events → findings with the next step (pure: time passed in).

An event maps to its GPU through the snapshot's bus ids; an Xid on no known GPU is the node's
finding, and an SXid is always the node's (it names an NVSwitch). Each (GPU, code) is one finding
while an event of it lies in the window: it alerts once, and resolves once the window has passed
with none. A code seen ``XidClass.burst`` times in the window on one GPU is a second finding, for
on-call, with the class's burst step. A finding whose step is to drain and reboot, or whose code
came ``XidClass.drain_at`` times in the window on one GPU, says a scheduler may drain its node
(``Finding.drain``: the Drain button on a Slurm node); its next step stays the code's.

Evidence that accuses a person is that person's own: an application code's lines are counted
per faulting process, never per line. Any user can open a context on another's GPU and fault
there at will, so one owner's burst stays that owner's finding with no reset offered; it becomes
on-call's only across distinct KNOWN owners (``known_owner``: named accounts root controls, never
a subordinate uid or an unnamed slice's ``uid N``). An owner gpubot cannot prove (a process gone
by the sweep) is never counted as another person: one user can fault from as many short-lived
processes as they like. Every finding says whose processes wrote its lines.

Never trusted: the name in a line is what the process calls itself; it is shown escaped
(``core.text.code``) and decides nothing. A line's owner is that of the process holding the GPU
under that pid in the same sweep and started by the line, as ``/proc`` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpubot.core.findings import Finding, FindingKind
from gpubot.core.health.codes import (
    DRAIN_REBOOT,
    QUIET,
    TELL_OWNER,
    XidClass,
    sxid_class,
    xid_class_named,
)
from gpubot.core.health.kernlog import XidEvent, gpu_bus
from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.names import is_linux_user
from gpubot.core.text import code as mark

# Events, not states: a kernel log line is read once, so it is real when first seen.
GPU_XID = FindingKind("gpu-xid", "Xid error", event=True)
NVSWITCH_SXID = FindingKind("nvswitch-sxid", "NVSwitch SXid error", event=True)

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
    return {bus: g.index for g in snap.gpus if (bus := gpu_bus(g.bus_id)) is not None}


def classify(e: XidEvent) -> XidClass:
    """Return the class of one event."""
    return sxid_class(e.code, e.text) if e.sxid else xid_class_named(e.code, e.text)


BURST_OWNERS = 2  # distinct known owners that make an application burst on-call's
START_SLACK_S = 2.0  # a line's time has whole seconds; /proc's start time, ticks


@dataclass(frozen=True)
class Source:
    """One faulting process of a group of lines: the kernel's pid, how many lines it wrote, the
    name the line gives it (display only) and its owner as ``/proc`` says (None: unknown)."""

    pid: int
    lines: int
    name: str | None
    owner: str | None
    why: str = ""  # why no owner: "no longer on the GPU", "pid reused since the line"


@dataclass(frozen=True)
class Group:
    """The events of one (node, GPU or bus, code) in the window, and whose processes they are."""

    node: str
    gpu: int | None
    bus: str
    seen: tuple[Seen, ...]
    snap: NodeSnapshot | None

    @property
    def lines(self) -> int:
        """Return how many lines the group stands for (summaries count every line they hold)."""
        return sum(s.event.count for s in self.seen)

    def sources(self) -> list[Source]:
        """Return the distinct faulting processes (by the kernel's pid), in order of first line.

        Two pids are two processes. One pid is counted once: a pid reused between two lines
        would be two processes counted as one, which can only keep a burst its owner's."""
        by: dict[int, list[XidEvent]] = {}
        for s in self.seen:
            if s.event.pid is not None and s.event.pid.isdigit() and not s.event.summary:
                by.setdefault(int(s.event.pid), []).append(s.event)
        out = []
        for pid, events in by.items():
            first = min((e.at for e in events if e.at is not None), default=None)
            owner, why = self._owner(pid, first)
            out.append(Source(pid, len(events), events[-1].name, owner, why))
        return out

    def _owner(self, pid: int, first: float | None) -> tuple[str | None, str]:
        """Return whose process ``pid`` is: the one on this GPU under that pid that had started
        by the first line (so it wrote the line: a live process keeps its pid), never the
        line's name."""
        snap, gpu = self.snap, self.gpu
        if snap is None or gpu is None:
            return None, ""
        held = [p for p in snap.on_gpu(gpu) if p.pid == pid and p.exists]
        if not held:
            return None, "no longer on the GPU"
        p = held[0]
        if first is not None and (
            p.elapsed_s is None or snap.taken_at - p.elapsed_s > first + START_SLACK_S
        ):
            return None, "pid reused since the line"
        owner = known_owner(p)
        return owner, "" if owner is not None else "no named owner"


def known_owner(p: GpuProcess) -> str | None:
    """Return the owner of ``p`` that root controls, or None: its workload's owner when that is
    a named account (``core.workload.decide_owner``; a bare ``uid N`` slice names no one), else
    the process's user when that is a named account. A uid with no passwd entry (``231072``: a
    subordinate uid any user may run as through ``newuidmap``) is nobody's name: never an owner,
    never another person."""
    w = p.workload
    if w is not None and w.owner is not None:
        return w.owner if is_linux_user(w.owner) else None
    return p.user if is_linux_user(p.user) else None


def is_burst(cls: XidClass, group: Group) -> bool:
    """Whether ``group`` is past its code's repeat threshold: lines for a code that is not the
    job's own; for an application code, lines from the processes of distinct named owners
    (``known_owner``: root's word). Lines without a pid, or of processes whose owner is unknown
    (gone by the sweep, pid reused, an unnamed or subordinate uid), never count as other people:
    one user's short-lived processes or subordinate uids, however many, are evidence about that
    user's jobs, never a reason to reset another's GPU."""
    if not cls.burst or group.lines < cls.burst:
        return False
    owners = {s.owner for s in group.sources() if s.owner is not None}
    return cls.fault != "application" or len(owners) >= BURST_OWNERS


def drains(cls: XidClass, group: Group, step: str) -> bool:
    """Whether a scheduler's node may be drained for a finding of ``group`` whose next step is
    ``step``: that step is to drain and reboot, or the code came ``cls.drain_at`` times in the
    window on this GPU (lines, counted as a burst of a code that is not the job's own is)."""
    if step == DRAIN_REBOOT:
        return True
    return cls.drain_at > 0 and group.lines >= cls.drain_at


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
    for (node, gpu, _sxid, _code, bus), events in sorted(groups.items(), key=_order):
        group = Group(node, gpu, bus, tuple(events), snaps.get(node))
        # the newest line the driver wrote decides (an Xid 154: the action it names now)
        last = next((x.event for x in reversed(events) if not x.event.summary), events[-1].event)
        cls = classify(last)
        if cls.step != QUIET:
            out.append(_finding(group, cls, cls.step, burst=False))
        if is_burst(cls, group):
            out.append(_finding(group, cls, cls.burst_step, burst=True))
    return out


def _order(item: tuple[tuple[str, int | None, bool, int, str], list[Seen]]) -> tuple[object, ...]:
    node, gpu, sxid, code, bus = item[0]
    return (node, -1 if gpu is None else gpu, sxid, code, bus)


def _finding(group: Group, cls: XidClass, step: str, *, burst: bool) -> Finding:
    last = group.seen[-1].event
    bus, gpu, snap = group.bus, group.gpu, group.snap
    label = "SXid" if last.sxid else "Xid"
    kind = NVSWITCH_SXID if last.sxid else GPU_XID
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
    migs = sorted({s.event.mig for s in group.seen if s.event.mig})
    if migs:  # the driver's words, never a user's: its MIG instances on the GPU
        where += f" (MIG {', '.join(migs[:MAX_SOURCES_SHOWN])})"
    n = group.lines
    times = f"{n} in the window" if n > 1 else "once"
    shown = next((s.event for s in reversed(group.seen) if not s.event.summary), last)
    said = f" ({mark(shown.text[:120])})" if shown.text else ""
    capped = sum(s.event.count for s in group.seen if s.event.summary)
    dropped = f" ({capped} of them summarised by the kernel-log read's cap)" if capped else ""
    who, owner = _who(group)
    summary = (
        f"{label} {cls.code} {cls.name}: {cls.meaning}{where}{said}, {times}{dropped}"
        f"{who}; fault: {cls.fault}; next step: {step}"
        + (f" (past the threshold of {cls.burst})" if burst else "")
    )
    return Finding(
        group.node,
        gpu,
        kind,
        holder,
        summary,
        owner=owner if step == TELL_OWNER else None,
        next_step=step,
        drain=drains(cls, group, step),
    )


MAX_SOURCES_SHOWN = 4


def _who(group: Group) -> tuple[str, str | None]:
    """Return the words about whose processes wrote the lines (escaped) and the owner to tell.

    The owner is one known owner whose processes wrote EVERY line of the group that names a
    pid, and only while the read's cap dropped none (a dropped line may be anyone's); else none.
    Never the last line's process alone: one line of alice's after many of mallory's on her
    GPU would make all of them alice's. Lines with no pid are said apart and decide nothing."""
    sources = group.sources()
    bare = sum(1 for s in group.seen if not s.event.summary and not (s.event.pid or "").isdigit())
    words = ""
    if sources:
        owners = {s.owner for s in sources if s.owner is not None}
        of = f" of {len(owners)} owners" if len(owners) > 1 else ""
        shown = [_source(s) for s in sources[-MAX_SOURCES_SHOWN:]]
        more = len(sources) - len(shown)
        words = (
            f"; raised by {len(sources)} process{'es' if len(sources) != 1 else ''}{of}: "
            + ", ".join(shown)
            + (f" and {more} more" if more > 0 else "")
        )
    if bare:
        words += f"; {bare} line{'s' if bare != 1 else ''} name{'s' if bare == 1 else ''} no pid"
    named = {s.owner for s in sources}
    capped = any(s.event.summary for s in group.seen)
    owner = next(iter(named)) if len(named) == 1 and not capped else None  # None: unknown
    return words, owner


def _source(s: Source) -> str:
    whose = f"{mark(s.owner)}'s" if s.owner else (s.why or "owner unknown")
    times = f" ×{s.lines}" if s.lines > 1 else ""
    return f"pid {mark(str(s.pid))} {mark(s.name or '?')} ({whose}){times}"
