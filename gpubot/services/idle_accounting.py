"""Idle accounting: every sweep's GPU samples, and which GPUs have been held idle for how long.

Every sweep, by hand or scheduled, stores one utilisation sample per GPU through the
``SampleStore`` port and prunes those older than ``[sweep] keep_samples``; GPUs whose samples say
0 % for ``idle_hours`` make idle-holder findings (``gpubot.core.idle``), and the GPU-hours each
owner holds idle are what the Home tab shows (``gpu_hours``). A store that fails leaves no GPU
idle: unknown is not idle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpubot.core.alerting import held_idle_hours
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import SweepConfig, find
from gpubot.core.idle import held_idle, idle_gpus, samples_of
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import Clock, SampleStore
from gpubot.core.protect import Protection
from gpubot.errors import StoreError

log = logging.getLogger(__name__)

IdleSeconds = dict[tuple[str, int], float]  # (node, gpu) -> seconds held idle


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

    async def idle(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleSeconds:
        """Return ``{(node, gpu): seconds held idle}`` of the GPUs idle for the idle window.

        Two reads, each only of GPUs held idle now: the window (are they idle long enough?),
        then, for those that are, every sample kept (since when?).
        """
        rule, gap = self.config.idle, self.config.max_gap_s
        if not rule.enabled:
            return {}
        current = [s for s in samples_of(snaps, now) if held_idle(s, rule.min_mib)]
        if not current:
            return {}
        try:
            window = await self.samples.samples_since(
                now - rule.window_s - gap, gpus={(s.node, s.gpu) for s in current}
            )
            idle = idle_gpus(current, window, rule, max_gap_s=gap)
            if not idle:
                return {}
            kept = await self.samples.samples_since(now - rule.keep_s, gpus=idle.keys())
        except StoreError as exc:
            log.warning("idle GPUs not looked for: %s", exc)
            return {}
        still = [s for s in current if (s.node, s.gpu) in idle]
        return idle_gpus(still, kept, rule, max_gap_s=gap)

    async def keep(self, snaps: Sequence[NodeSnapshot], now: float) -> None:
        """Store this sweep's samples (one insert) and prune those older than ``keep_samples``."""
        try:
            await self.samples.add_samples(samples_of(snaps, now))
            await self.samples.prune_samples(now - self.config.idle.keep_s)
        except StoreError as exc:  # the sweep stands; idle detection misses this sample
            log.warning("GPU samples not stored: %s", exc)

    async def gpu_hours(self, snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
        """Return the GPU-hours each owner holds idle now, for ``snapshots`` (the Home tab)."""
        idle = await self.idle(snapshots, self.clock.now())
        if not idle:
            return {}
        found = find(snapshots, {}, self.config, protection=self.protection, idle=idle)
        return held_idle_hours(found)


async def no_idle_hours(snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
    """Without samples nothing is known to be idle (no database)."""
    return {}
