"""Idle accounting: every sweep's GPU samples, and which GPUs have been held idle for how long.

Every sweep, by hand or scheduled, stores one utilisation sample per GPU through the
``SampleStore`` port and, in the same transaction, advances each GPU's idle run
(``core.idle_runs``: since when it has been held idle). GPUs held idle for ``idle_hours`` make
idle-holder findings (``gpubot.core.idle``), and the GPU-hours each owner holds idle are what
the Home tab shows (``gpu_hours``). Both read the runs, one row per GPU, never the samples'
history: a sweep costs the same with 1 or 14 days kept. A holder is idle only for the part of
its GPU's run it was there for (``core.holder_runs``): each sweep's look at who holds each GPU
is folded into runs kept here, in memory (a few per GPU); after a restart, a holder's run starts
no earlier than its process did. Samples older than ``[sweep]
keep_samples`` are pruned, at most ``PRUNE_BATCH`` a sweep, so that a backlog (after an upgrade
or a shorter ``keep_samples``) never holds one sweep up. A store that fails leaves no GPU idle:
unknown is not idle.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpubot.core.alerting import held_idle_hours
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import SweepConfig, find
from gpubot.core.holder_runs import HolderKey, OnGpu, look, on_gpu_since
from gpubot.core.idle import TIME_SLACK_S, held_idle, samples_of
from gpubot.core.idle_runs import RunRule
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import Clock, SampleStore
from gpubot.core.protect import Protection
from gpubot.errors import StoreError
from gpubot.services.offload import off_loop

log = logging.getLogger(__name__)

IdleSeconds = dict[tuple[str, int], float]  # (node, gpu) -> seconds held idle
PRUNE_BATCH = 50_000  # samples pruned per sweep at most (a 1,000-node fleet adds 8,000)


@dataclass(frozen=True)
class IdleTimes:
    """The GPUs held idle for the window at ``at``, and since when each holder held its GPU."""

    at: float
    gpus: IdleSeconds = field(default_factory=dict)
    held: dict[HolderKey, float] = field(default_factory=dict)


class IdleAccounting:
    """Keeps the sweeps' GPU samples and says which GPUs are held idle, for how long."""

    def __init__(
        self,
        config: SweepConfig,
        protection: Protection,
        samples: SampleStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.protection = protection
        self.samples = samples
        self.clock = clock
        self._runs: dict[HolderKey, OnGpu] = {}  # each holder's run on its GPU (holder_runs)

    @property
    def rule(self) -> RunRule:
        """Return what makes an idle run under the settings."""
        return RunRule.of(self.config.idle.min_mib, self.config.max_gap_s)

    async def sweep(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleTimes:
        """Store this sweep's samples and advance the runs (one transaction), prune a bounded
        batch of old samples; return the idle GPUs and since when each holder held its GPU."""
        self._runs = look(self._runs, snaps, now, self.config.max_gap_s)
        held = on_gpu_since(self._runs)
        return IdleTimes(now, await self._sweep(snaps, now), held)

    def held(self, snaps: Sequence[NodeSnapshot], now: float) -> dict[HolderKey, float]:
        """Return since when each holder of ``snaps`` has held its GPU, keeping nothing."""
        return on_gpu_since(look(self._runs, snaps, now, self.config.max_gap_s))

    async def _sweep(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleSeconds:
        keep_from = now - self.config.idle.keep_s
        samples = await off_loop(samples_of, snaps, now)  # 16,000 at 2,000 nodes
        try:
            since = await self.samples.advance_idle(samples, self.rule, keep_from=keep_from)
        except StoreError as exc:  # the sweep stands; idle detection misses this sample
            log.warning("GPU samples not stored, idle GPUs not looked for: %s", exc)
            return {}
        try:
            await self.samples.prune_samples(keep_from, limit=PRUNE_BATCH)
        except StoreError as exc:
            log.warning("old GPU samples not pruned: %s", exc)
        return self._long_enough(since, now)

    async def idle(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleSeconds:
        """Return the GPUs of ``snaps`` idle for the idle window, storing nothing (a status).

        Only the GPUs held idle now are asked about; the runs say since when.
        """
        rule = self.config.idle
        if not rule.enabled:
            return {}
        current = [s for s in samples_of(snaps, now) if held_idle(s, rule.min_mib)]
        if not current:
            return {}
        try:
            since = await self.samples.idle_since(current, self.rule, keep_from=now - rule.keep_s)
        except StoreError as exc:
            log.warning("idle GPUs not looked for: %s", exc)
            return {}
        return self._long_enough(since, now)

    def _long_enough(self, since: Mapping[tuple[str, int], float], now: float) -> IdleSeconds:
        """Return the GPUs held idle for at least the window, and for how long."""
        rule = self.config.idle
        if not rule.enabled:
            return {}
        window = rule.window_s - TIME_SLACK_S
        return {k: round(now - s, 3) for k, s in since.items() if now - s >= window}

    async def gpu_hours(self, snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
        """Return the GPU-hours each owner holds idle now, for ``snapshots`` (the Home tab)."""
        now = self.clock.now()
        idle = await self.idle(snapshots, now)
        if not idle:
            return {}
        held = self.held(snapshots, now)
        found = find(
            snapshots, {}, self.config, protection=self.protection, idle=idle, held=held, at=now
        )
        return held_idle_hours(found)


async def no_idle_hours(snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
    """Without samples nothing is known to be idle (no database)."""
    return {}
