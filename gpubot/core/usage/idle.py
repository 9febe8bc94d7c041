"""Idle hoarders: GPUs held at 0 % utilisation for hours, from the samples every sweep keeps.

Pure (standard library only, time passed in). Every sweep records one ``GpuSample`` per GPU
(utilisation and memory in use). A GPU is *held idle* from the first sample of the run of
samples that ends now in which every sample says 0 % utilisation with at least ``min_mib`` in
use. Unknown is not idle: a sample whose utilisation or memory is unknown (``None``) ends the
run, and so does a gap between two samples longer than ``max_gap_s`` (a sweep that did not
reach the node says nothing of that time). A GPU held idle for at least the rule's window is
*idle*; each process on it holding at least ``min_mib`` is an *idle holder*, and the time the
GPU has been held idle so far counts as that holder's idle GPU time.

Settings, in the ``[sweep]`` table (validated by ``gpubot.config``)::

    idle_min_mib = 4096      # a process holding less is not hoarding
    idle_hours = 4           # 0 % over every sample for this long (0 turns idle findings off)
    keep_samples = "14d"     # samples older than this are pruned (a duration: core.durations)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.plan import owner_of
from gpubot.core.workload import named

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
        """Whether idle holders are looked for at all."""
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
        """Return which GPU this is a sample of."""
        return (self.node, self.gpu, self.uuid)


def samples_of(snapshots: Iterable[NodeSnapshot], taken_at: float) -> list[GpuSample]:
    """Return one sample per GPU of ``snapshots``, all taken at ``taken_at`` (the sweep's time)."""
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
    """Return since when one GPU has been held idle, ``current`` being its sample now.

    ``history`` holds this GPU's earlier samples (any order; others are ignored). None: the GPU
    is not held idle now.
    """
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
        line += f": {w.describe()}"
    return line


def gpu_hours_by_owner(
    held: Iterable[tuple[str | None, str, int, float]],
) -> dict[str, float]:
    """Sum GPU-hours held idle per owner from ``(owner, node, gpu, idle seconds)`` rows.

    A GPU counts once per owner however many of their processes hold it; unknown owners are
    left out. Owners are sorted by hours, most first.
    """
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
