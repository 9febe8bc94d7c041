"""Idle hoarders: GPUs held at 0 % utilisation for hours, from the samples every sweep keeps.

A GPU is *held idle* since the first of the samples ending now that all say 0 % with at least
``min_mib`` in use. Unknown is not idle: an unknown sample ends the run, and so does a gap
longer than ``max_gap_s`` (a missed sweep says nothing of that time). A GPU held idle for the
rule's window is *idle*; each process on it holding ``min_mib`` is an *idle holder*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.plan import owner_of
from gpubot.core.workload import describe, named

DEFAULT_MIN_MIB = 4096
DEFAULT_HOURS = 4.0
DEFAULT_KEEP_S = 14 * 86400.0
# A gap between two samples longer than this many sweep intervals breaks an idle run: a missed
# sweep is a stretch of time nobody looked at.
MAX_GAP_INTERVALS = 1.5

GpuKey = tuple[str, int, str]  # (node, GPU index, GPU uuid): a sample counts for its GPU only


@dataclass(frozen=True)
class IdleRule:
    """When a process is an idle holder, and how long samples are kept."""

    min_mib: int = DEFAULT_MIN_MIB
    hours: float = DEFAULT_HOURS  # 0: idle findings off
    keep_s: float = DEFAULT_KEEP_S

    @property
    def enabled(self) -> bool:
        return self.hours > 0

    @property
    def window_s(self) -> float:
        """Return how long a GPU must be held idle before its holders are idle holders."""
        return self.hours * 3600.0


@dataclass(frozen=True)
class GpuSample:
    """One GPU's utilisation and memory as one sweep saw them."""

    node: str
    gpu: int
    uuid: str
    taken_at: float  # unix time of the sweep
    utilization_pct: int | None
    memory_used_mib: int | None

    @property
    def key(self) -> GpuKey:
        return (self.node, self.gpu, self.uuid)


def samples_of(snapshots: Iterable[NodeSnapshot], taken_at: float) -> list[GpuSample]:
    """Return one sample per GPU of ``snapshots``, all taken at the sweep's time."""
    return [
        GpuSample(s.node, g.index, g.uuid, taken_at, g.utilization_pct, g.memory_used_mib)
        for s in snapshots
        for g in sorted(s.gpus, key=lambda g: g.index)
    ]


def held_idle(s: GpuSample, min_mib: int) -> bool:
    return s.utilization_pct == 0 and s.memory_used_mib is not None and s.memory_used_mib >= min_mib


def held_idle_since(
    history: Sequence[GpuSample], current: GpuSample, *, min_mib: int, max_gap_s: float
) -> float | None:
    """Return since when one GPU has been held idle (None: it is not); ``history`` in any order,
    other GPUs' samples ignored."""
    if not held_idle(current, min_mib):
        return None
    earlier = sorted(
        (s for s in history if s.key == current.key and s.taken_at < current.taken_at),
        key=lambda s: s.taken_at,
        reverse=True,
    )
    since = current.taken_at
    for s in earlier:
        if since - s.taken_at > max_gap_s or not held_idle(s, min_mib):
            break
        since = s.taken_at
    return since


def idle_gpus(
    current: Sequence[GpuSample],
    history: Sequence[GpuSample],
    rule: IdleRule,
    *,
    max_gap_s: float,
) -> dict[tuple[str, int], float]:
    """Return ``{(node, gpu): seconds held idle so far}`` of the GPUs idle for the rule's window."""
    if not rule.enabled:
        return {}
    by_gpu: dict[GpuKey, list[GpuSample]] = {}
    for s in history:
        by_gpu.setdefault(s.key, []).append(s)
    out: dict[tuple[str, int], float] = {}
    for now in current:
        since = held_idle_since(
            by_gpu.get(now.key, []), now, min_mib=rule.min_mib, max_gap_s=max_gap_s
        )
        if since is not None and now.taken_at - since >= rule.window_s - TIME_SLACK_S:
            out[(now.node, now.gpu)] = round(now.taken_at - since, 3)
    return out


def is_idle_holder(p: GpuProcess, rule: IdleRule) -> bool:
    """Whether ``p`` holds enough memory to be an idle holder of an idle GPU."""
    return p.exists and p.used_memory_mib is not None and p.used_memory_mib >= rule.min_mib


def holder_owner(p: GpuProcess) -> str | None:
    """Return whose job ``p`` is: its workload's owner, else the process's user."""
    return owner_of(p)[0]


def idle_summary(p: GpuProcess, g: GpuInfo, idle_for: str) -> str:
    """Return the one line a person reads about an idle holder (``idle_for``: "4 h 10 min")."""
    who = f"pid {p.pid} {p.process_name}" + (f" ({p.user})" if p.user else "")
    line = f"{who} holds {p.used_memory_mib} MiB of GPU {g.index}, idle (0 %) for {idle_for}"
    w = p.workload
    if w is not None and named(w):
        line += f": {describe(w)}"
    return line


def gpu_hours_by_owner(
    held: Iterable[tuple[str | None, str, int, float]],
) -> dict[str, float]:
    """Sum GPU-hours held idle per owner, most first; a GPU counts once per owner."""
    per: dict[tuple[str, str, int], float] = {}
    for owner, node, gpu, idle_s in held:
        if owner is None:
            continue
        key = (owner, node, gpu)
        per[key] = max(per.get(key, 0.0), idle_s)
    out: dict[str, float] = {}
    for (owner, _, _), idle_s in per.items():
        out[owner] = out.get(owner, 0.0) + idle_s / 3600.0
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))
