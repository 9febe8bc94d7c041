"""Holder runs: since when each process has held its GPU, so idle time accuses only its holder.

A GPU's idle run says since when it has been at 0 %; a process that came later was not there for
that time. Mallory's job sits idle on GPU 3, bob's arrives and loads data at 0 %, hers ends:
without this, bob's new job would be named idle for the whole run, with mallory's evidence. So a
holder's idle time is cut to its time on the GPU: since the first look that saw this process (pid
+ start ticks) there, in an unbroken run of looks.

A look longer than ``max_gap_s`` after the last says nothing of the time between and starts the
run again. Each GPU has a run of its own looks (holder ``""``): a process first seen on a GPU
looked at without a gap arrived since that look. On a GPU nobody has looked at, a run starts no
earlier than the process's own start, and one of unknown age starts now (unknown is not idle).

The runs are folded in the store's transaction that advances the GPUs' idle runs, so every
process (the bot, a replica, the CLI) folds into the same runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gpubot.core.models import GpuProcess, NodeSnapshot

HolderKey = tuple[str, int, str]  # (node, GPU index, "pid:start_ticks"; "": the GPU's own looks)
Held = dict[HolderKey, float]  # since when each process has held its GPU
GPU_LOOKS = ""


@dataclass(frozen=True)
class OnGpu:
    """Since when one process (or the GPU's looks) has been seen on a GPU, and the last look."""

    since: float
    last_at: float


@dataclass(frozen=True)
class Looked:
    """One sweep's (or status's) look at who holds each GPU, for the store to fold."""

    snaps: tuple[NodeSnapshot, ...]
    at: float  # the sweep's time
    max_gap_s: float

    def fold(self, runs: Mapping[HolderKey, OnGpu]) -> dict[HolderKey, OnGpu]:
        return look(runs, self.snaps, self.at, self.max_gap_s)


class IdleNow(NamedTuple):
    """Since when each held-idle GPU has been held idle, and since when each holder has held
    its GPU (empty: no look folded)."""

    gpus: dict[tuple[str, int], float]
    held: Held


def holder_key(node: str, p: GpuProcess) -> HolderKey | None:
    """Return the key of ``p``'s run (None: gone from /proc, no identity to keep)."""
    if p.start_ticks is None or p.pid <= 0:
        return None
    return (node, p.gpu_index, f"{p.pid}:{p.start_ticks}")


def started(p: GpuProcess, at: float) -> float | None:
    """Return when ``p`` started, its age counted back from the sweep's time ``at``: a moment
    early at worst, never by a sweep's interval."""
    return None if p.elapsed_s is None else at - p.elapsed_s


def look(
    runs: Mapping[HolderKey, OnGpu],
    snaps: Iterable[NodeSnapshot],
    now: float,
    max_gap_s: float,
) -> dict[HolderKey, OnGpu]:
    """Return the runs after a look at ``snaps``; a node that did not answer keeps its runs
    until they are older than ``max_gap_s``."""
    out: dict[HolderKey, OnGpu] = {}
    answered: set[str] = set()
    for snap in snaps:
        answered.add(snap.node)
        for g in snap.gpus:
            mark = runs.get((snap.node, g.index, GPU_LOOKS))
            watched = mark is not None and now - mark.last_at <= max_gap_s
            out[(snap.node, g.index, GPU_LOOKS)] = _next(mark if watched else None, now, now)
            for p in snap.on_gpu(g.index):
                key = holder_key(snap.node, p)
                if key is None:
                    continue
                old = runs.get(key)
                if old is not None and now - old.last_at <= max_gap_s:
                    out[key] = _next(old, now, now)
                else:
                    first = now if watched else started(p, now)
                    out[key] = _next(None, now, now if first is None else first)
    for key, run in runs.items():
        if key[0] not in answered and now - run.last_at <= max_gap_s:
            out[key] = run
    return out


def _next(old: OnGpu | None, now: float, first: float) -> OnGpu:
    """Return a run carried on to a look at ``now`` (``old`` None: one starting at ``first``)."""
    if old is None:
        return OnGpu(first, now)
    return OnGpu(old.since, max(old.last_at, now))  # an overlapping sweep's look is no later


def on_gpu_since(runs: Mapping[HolderKey, OnGpu]) -> Held:
    """Return since when each process has held its GPU (the GPUs' own looks left out)."""
    return {k: r.since for k, r in runs.items() if k[2] != GPU_LOOKS}


def holders_idle(
    snap: NodeSnapshot,
    gpu: int,
    gpu_idle_s: float,
    held: Mapping[HolderKey, float] | None,
    at: float,
    window_s: float,
) -> dict[str, tuple[float, float]]:
    """Return ``{"pid:start_ticks": (seconds held idle, since when)}`` of ``gpu``'s holders idle
    for ``window_s``; each share starts no earlier than the holder's own run (``held``; None:
    its own start), and an unknown start has none."""
    out: dict[str, tuple[float, float]] = {}
    for p in snap.on_gpu(gpu):
        key = holder_key(snap.node, p)
        if key is None:
            continue
        mine = started(p, at) if held is None else held.get(key)
        if mine is None:
            continue
        since = max(at - gpu_idle_s, mine)
        if at - since >= window_s:  # else its GPU was idle that long, but it was not there
            out[key[2]] = (round(at - since, 3), since)
    return out
