"""Idle runs: since when each GPU has been held idle, kept up to date sweep by sweep.

Pure (standard library only). ``core.usage.idle`` defines a GPU's idle time from its whole sample
history: the run of held-idle samples that ends now, broken by a busy or unknown sample or by a
gap longer than ``max_gap_s``. Rereading that history every sweep costs what the history holds
(14 days of a 1,000-node fleet: millions of rows). An ``IdleRun`` is the same answer carried
forward: per GPU, its latest sample's time and the start of the held-idle run ending there.
``advance`` folds one new sample into it, so a sweep reads one small row per GPU, whatever the
history.

The fold gives exactly ``held_idle_since`` over the same samples, in time order (tests compare
the two over generated histories). Two cases cannot be folded and are rebuilt from the GPU's own
samples (``rebuild``): a sample no later than the run's latest (two sweeps overlapping), and a
run kept under other settings (``min_mib`` or the gap changed since).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpubot.core.usage.idle import GpuKey, GpuSample, held_idle


@dataclass(frozen=True)
class RunRule:
    """What makes a run: the memory a held-idle GPU holds, the longest gap between samples."""

    min_mib: int
    max_gap_ms: int  # whole milliseconds: stored as such, compared exactly

    @classmethod
    def of(cls, min_mib: int, max_gap_s: float) -> RunRule:
        """Return the rule of ``[sweep]`` settings (the gap rounded to milliseconds)."""
        return cls(min_mib, round(max_gap_s * 1000))

    @property
    def max_gap_s(self) -> float:
        """Return the longest gap, in seconds."""
        return self.max_gap_ms / 1000.0


@dataclass(frozen=True)
class IdleRun:
    """One GPU's latest sample time, and since when it has been held idle (None: it is not)."""

    node: str
    gpu: int
    uuid: str
    last_at: float
    idle_since: float | None
    rule: RunRule

    @property
    def key(self) -> GpuKey:
        """Return which GPU this is the run of."""
        return (self.node, self.gpu, self.uuid)


def can_advance(run: IdleRun | None, sample: GpuSample, rule: RunRule) -> bool:
    """Whether ``sample`` folds into ``run`` (False: rebuild from the GPU's samples)."""
    return run is None or (run.rule == rule and sample.taken_at > run.last_at)


def advance(run: IdleRun | None, sample: GpuSample, rule: RunRule) -> IdleRun:
    """Return the run after ``sample``, the GPU's next sample (``can_advance`` must hold).

    ``run`` None: nothing earlier is known of this GPU.
    """
    since: float | None = None
    if held_idle(sample, rule.min_mib):
        since = sample.taken_at
        if (
            run is not None
            and run.idle_since is not None
            and sample.taken_at - run.last_at <= rule.max_gap_s
        ):
            since = run.idle_since
    return IdleRun(sample.node, sample.gpu, sample.uuid, sample.taken_at, since, rule)


def rebuild(samples: Iterable[GpuSample], rule: RunRule) -> IdleRun | None:
    """Return the run of one GPU from its samples, in the order they were stored (None: none).

    Samples taken at the same time read as ``held_idle_since`` reads them, walking back from
    later ones in stored order: the first stored decides whether the run reaches that time,
    and any other not held idle starts the run there.
    """
    run: IdleRun | None = None
    ordered = sorted(samples, key=lambda s: s.taken_at)  # stable: ties keep their order
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j].taken_at == ordered[i].taken_at:
            j += 1
        first, tied = ordered[i], ordered[i:j]
        run = advance(run, first, rule)
        if run.idle_since is not None and not all(held_idle(s, rule.min_mib) for s in tied):
            run = replace(run, idle_since=first.taken_at)
        i = j
    return run


def kept_since(since: float, first_kept: float | None, current: float) -> float:
    """Return since when a GPU counts as held idle, given what the samples still hold.

    The history counts only samples kept (``keep_samples``): a run older than that starts at
    the first sample kept (``first_kept``, None: none is kept but the current one).
    """
    if first_kept is None:
        return current
    return max(since, first_kept)
