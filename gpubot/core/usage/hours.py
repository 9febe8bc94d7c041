"""GPU-hours: what each sweep's sample of a GPU adds to its node's and its holders' hours.

Each sweep's sample of a GPU counts for the time since its previous one (one interval after a
longer gap: *missing data*, reported, never guessed), in whole milliseconds, in the UTC hour it
was taken: the GPU's own *busy*/*idle*/*unknown*/*free*/*unused* figures (user ``""``); each
holder's share, split so no GPU-hour counts twice; *claimed but unused* for a claimant holding
nothing there or at 0 %. Summing the buckets of a window gives exactly the sum over its samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpubot.core.models import NodeSnapshot
from gpubot.core.usage.idle import holder_owner

GAP_INTERVALS = 2.0  # a gap longer than this many sweep intervals is missing data
HOUR_S = 3600
UNKNOWN_USER = "(unknown)"  # a holder whose owner nobody could say
NODE_ROW = ""  # the user of a GPU's own figures
KINDS = ("busy", "idle", "unknown", "unused", "free")


@dataclass(frozen=True)
class GpuState:
    """One GPU as one sweep saw it: utilisation (None: not said) and who holds it."""

    node: str
    gpu: int
    utilization_pct: int | None
    owners: tuple[str, ...]  # sorted, distinct; empty: nobody holds it


@dataclass(frozen=True)
class Claimed:
    """A claim of one GPU by one person, from ``start`` until ``end`` (unix times)."""

    node: str
    gpu: int
    user: str
    start: float
    end: float


@dataclass
class Usage:
    """Milliseconds of one bucket: one hour of one GPU, for one person (``""``: the GPU)."""

    hour: int  # unix time of the hour's start
    node: str
    gpu: int
    user: str
    busy: int = 0
    idle: int = 0
    unknown: int = 0
    unused: int = 0
    free: int = 0
    samples: int = 0

    @property
    def key(self) -> tuple[int, str, int, str]:
        return (self.hour, self.node, self.gpu, self.user)

    def add(self, other: Usage) -> None:
        for k in (*KINDS, "samples"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass(frozen=True)
class Gap:
    """A stretch of a node with no sample (``end`` None: none since)."""

    node: str
    start: float
    end: float | None


@dataclass
class Tally:
    """What one sweep adds: the buckets, and the nodes' gaps it closes."""

    rows: dict[tuple[int, str, int, str], Usage] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)

    def bucket(self, hour: int, node: str, gpu: int, user: str) -> Usage:
        return self.rows.setdefault((hour, node, gpu, user), Usage(hour, node, gpu, user))


def hour_of(t: float) -> int:
    """Return the start of the UTC hour ``t`` is in."""
    return math.floor(t / HOUR_S) * HOUR_S


def states_of(snapshots: Iterable[NodeSnapshot]) -> list[GpuState]:
    """Return each GPU's state; a protected system daemon holds no one's GPU-hours."""
    out: list[GpuState] = []
    for snap in snapshots:
        for g in sorted(snap.gpus, key=lambda g: g.index):
            owners = {
                holder_owner(p) or UNKNOWN_USER
                for p in snap.on_gpu(g.index)
                if p.exists and not p.system
            }
            out.append(GpuState(snap.node, g.index, g.utilization_pct, tuple(sorted(owners))))
    return out


def from_future(prev: float, now: float, interval_s: float) -> bool:
    """Whether a sample at ``prev`` is later than ``now`` by more than an interval: a clock
    stepped back leaves one, and as a baseline it would make every sweep add nothing."""
    return prev - now > interval_s


def weight_ms(prev: float | None, now: float, interval_s: float) -> int:
    """Return the milliseconds a sample counts for: the time since ``prev``, or one interval
    after missing data (a ``prev`` from the future is such a gap too)."""
    if prev is not None and from_future(prev, now, interval_s):
        prev = None
    if prev is not None and now <= prev:
        return 0  # an overlapping sweep: that time is counted already
    if prev is None or now - prev > GAP_INTERVALS * interval_s:
        return round(interval_s * 1000)
    return round((now - prev) * 1000)


def shares(total: int, owners: Sequence[str]) -> dict[str, int]:
    """Split ``total`` milliseconds between ``owners`` (whole ms, remainder to the first)."""
    if not owners:
        return {}
    each, rest = divmod(total, len(owners))
    return {u: each + (1 if i < rest else 0) for i, u in enumerate(owners)}


def _kind(state: GpuState) -> str:
    if not state.owners:
        return "free"
    if state.utilization_pct is None:
        return "unknown"
    return "busy" if state.utilization_pct > 0 else "idle"


@dataclass(frozen=True)
class SweepSample:
    """One sweep's states, when it was taken, and the GPUs' and nodes' previous samples."""

    at: float
    states: Sequence[GpuState]
    prev_gpu: Mapping[tuple[str, int], float]  # (node, gpu) -> its latest sample before
    prev_node: Mapping[str, float]  # node -> its latest sample before
    claims: Sequence[Claimed] = ()
    interval_s: float = 300.0


def tally(s: SweepSample) -> Tally:
    """Return what one sweep adds to the GPU-hours, and the gaps of missing data it ends."""
    out = Tally()
    hour = hour_of(s.at)
    covering: dict[tuple[str, int], list[Claimed]] = {}
    for c in s.claims:
        if c.start <= s.at < c.end:
            covering.setdefault((c.node, c.gpu), []).append(c)
    for node in sorted({st.node for st in s.states}):
        last = s.prev_node.get(node)
        if last is not None and from_future(last, s.at, s.interval_s):
            # What ran since the last sample placed in this timeline is not known: a gap of
            # one interval up to this sweep, named in reports, never a silent loss.
            out.gaps.append(Gap(node, s.at - s.interval_s, s.at))
        elif last is not None and s.at - last > GAP_INTERVALS * s.interval_s:
            out.gaps.append(Gap(node, last, s.at))
    for st in s.states:
        w = weight_ms(s.prev_gpu.get((st.node, st.gpu)), s.at, s.interval_s)
        kind = _kind(st)
        gpu_row = out.bucket(hour, st.node, st.gpu, NODE_ROW)
        gpu_row.samples += 1
        setattr(gpu_row, kind, getattr(gpu_row, kind) + w)
        for user, part in shares(w, st.owners).items():
            row = out.bucket(hour, st.node, st.gpu, user)
            row.samples += 1
            setattr(row, kind, getattr(row, kind) + part)
        for c in covering.get((st.node, st.gpu), []):
            if c.user not in st.owners or st.utilization_pct == 0:
                out.bucket(hour, st.node, st.gpu, c.user).unused += w
                gpu_row.unused += w
    return out


@dataclass(frozen=True)
class UsageSweep:
    """What one sweep hands the store."""

    at: float
    states: Sequence[GpuState]
    claims: Sequence[Claimed] = ()
    interval_s: float = 300.0


@dataclass(frozen=True)
class UsageRecords:
    """What a report reads: buckets, sweeps counted, gaps and each node's last sample."""

    rows: tuple[Usage, ...]
    sweeps: int
    gaps: tuple[Gap, ...]
    last_seen: dict[str, float]
