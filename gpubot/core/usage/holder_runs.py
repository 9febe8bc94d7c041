"""Holder runs: since when each process has held its GPU, so idle time accuses only its holder.

Pure (standard library only, time passed in). A GPU's idle run (``core.usage.idle_runs``) says since
when the GPU has been at 0 %; a process that came to the GPU later was not there for that time.
Mallory's job sits idle on GPU 3, bob's arrives and loads data at 0 %, hers ends: the GPU's run
goes on, and without this bob's four-second-old job would be named idle for the whole of it,
with mallory's evidence (issue 34). So a holder's idle time is the GPU's run cut to the time the
holder has been on it: since the first look that saw this process (pid + start ticks, never the
pid alone) on this GPU, in an unbroken run of looks.

``look`` folds one sweep's snapshots into the runs, as the GPU's idle run is folded: a look
longer than ``max_gap_s`` after the last one says nothing of the time between, and starts the
holder's run again. Each GPU has a run of its own looks (holder ``""``): a process first seen on
a GPU looked at without a gap arrived since that look, so its run starts now. A GPU nobody has
looked at (gpubot just started, or a CLI status) cannot say when a holder came: its run starts
no earlier than the process's own start (the sweep's time less its age), and a process of
unknown age starts now (unknown is not idle).

The runs are kept in the store beside the GPUs' idle runs, folded in the transaction that
advances those (``Looked``): every process (the serving bot, a replica, the CLI, the bot after a
restart) folds its look into the same runs, so none mistakes a notebook started hours ago that
took a GPU minutes ago for the GPU's idle holder all along.
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
    """One sweep's (or status's) look at who holds each GPU, for the store to fold into the runs
    it keeps, in the transaction that advances the GPUs' idle runs."""

    snaps: tuple[NodeSnapshot, ...]
    at: float  # the sweep's time
    max_gap_s: float

    def fold(self, runs: Mapping[HolderKey, OnGpu]) -> dict[HolderKey, OnGpu]:
        """Return ``runs`` after this look."""
        return look(runs, self.snaps, self.at, self.max_gap_s)


class IdleNow(NamedTuple):
    """Since when each held-idle GPU has been held idle, and since when each holder has held
    its GPU (empty: no look folded)."""

    gpus: dict[tuple[str, int], float]
    held: Held


def holder_key(node: str, p: GpuProcess) -> HolderKey | None:
    """Return the key of ``p``'s run on its GPU (None: gone from /proc, no identity to keep;
    pid 0 is no process's, and keys the GPU's own looks in the store)."""
    if p.start_ticks is None or p.pid <= 0:
        return None
    return (node, p.gpu_index, f"{p.pid}:{p.start_ticks}")


def started(p: GpuProcess, at: float) -> float | None:
    """Return when ``p`` started, its age counted back from ``at`` (None: not known).

    ``at`` is the sweep's time, the clock its samples and runs are kept on (the probe ran a
    moment after it, so this errs a moment early, never by a sweep's interval).
    """
    return None if p.elapsed_s is None else at - p.elapsed_s


def look(
    runs: Mapping[HolderKey, OnGpu],
    snaps: Iterable[NodeSnapshot],
    now: float,
    max_gap_s: float,
) -> dict[HolderKey, OnGpu]:
    """Return the runs after a look at ``snaps`` at ``now`` (the sweep's time).

    The runs of a node that answered are those it shows now (a process gone from a GPU ends its
    run); a node that did not answer keeps its runs until they are older than ``max_gap_s``.
    """
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
    """Return ``{"pid:start_ticks": (seconds held idle, since when)}`` of GPU ``gpu``'s holders
    idle for at least ``window_s``.

    ``gpu_idle_s``: how long the GPU has been held idle at ``at`` (the sweep's time); each
    holder's share starts no earlier than its own run on the GPU (``held``: ``on_gpu_since`` of
    the runs; None: no runs kept, so each process's own start). A holder of unknown start has
    none: unknown is not idle.
    """
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
