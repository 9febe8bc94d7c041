"""Idle runs: since when each GPU has been held idle, kept up to date sweep by sweep.

Rereading each GPU's whole sample history every sweep costs what the history holds; an
``IdleRun`` carries the same answer forward, so a sweep reads one small row per GPU. The fold
gives exactly ``held_idle_since`` over the same samples. A sample no later than the run's
latest (overlapping sweeps) or a run kept under other settings is rebuilt from the samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.core.usage.idle import GpuKey, GpuSample, held_idle


@dataclass(frozen=True)
class RunRule:
    """What makes a run: the memory a held-idle GPU holds, the longest gap between samples."""

    min_mib: int
    max_gap_ms: int  # whole milliseconds: stored as such, compared exactly

    @classmethod
    def of(cls, min_mib: int, max_gap_s: float) -> RunRule:
        """Return the rule of ``[sweep]`` settings, the gap rounded to milliseconds."""
        return cls(min_mib, round(max_gap_s * 1000))

    @property
    def max_gap_s(self) -> float:
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
        return (self.node, self.gpu, self.uuid)


def can_advance(run: IdleRun | None, sample: GpuSample, rule: RunRule) -> bool:
    """Whether ``sample`` folds into ``run`` (False: rebuild from the GPU's samples)."""
    return run is None or (run.rule == rule and sample.taken_at > run.last_at)


def advance(run: IdleRun | None, sample: GpuSample, rule: RunRule) -> IdleRun:
    """Return the run after ``sample`` (``can_advance`` must hold; ``run`` None: none yet)."""
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


def kept_since(since: float, first_kept: float | None, current: float) -> float:
    """Return since when a GPU counts as held idle: a run older than the samples kept starts at
    the first kept (``first_kept`` None: only the current one)."""
    if first_kept is None:
        return current
    return max(since, first_kept)
