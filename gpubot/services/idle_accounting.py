"""Idle accounting: every sweep's GPU samples, and which GPUs have been held idle for how long.

Every sweep stores a sample per GPU and, in the same transaction, advances the idle and holder
runs, so findings read one row per GPU, never the history. A holder is idle only for the part of
its GPU's run it was there for. Old samples are pruned at most ``PRUNE_BATCH`` a sweep, so a
backlog never holds one up. A store that fails leaves no GPU idle: unknown is not idle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

from gpubot.core.alerting import held_idle_hours
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.findings import SweepConfig, find
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import Clock, SampleStore
from gpubot.core.reset.protect import Protection
from gpubot.core.usage.holder_runs import Held, IdleNow, Looked
from gpubot.core.usage.idle import GpuSample, held_idle, samples_of
from gpubot.core.usage.idle_runs import RunRule
from gpubot.errors import DUTY_TURN, StoreError
from gpubot.services.offload import off_loop

log = logging.getLogger(__name__)

IdleSeconds = dict[tuple[str, int], float]  # (node, gpu) -> seconds held idle
PRUNE_BATCH = 50_000  # samples pruned per sweep at most: several sweeps' worth of a large fleet


@dataclass(frozen=True)
class IdleTimes:
    """The GPUs held idle for the window at ``at``, and since when each holder held its GPU."""

    at: float
    gpus: IdleSeconds = field(default_factory=dict)
    held: Held = field(default_factory=dict)


@dataclass(eq=False)
class IdleAccounting:
    """Keeps the sweeps' GPU samples and says which GPUs are held idle, for how long."""

    config: SweepConfig
    protection: Protection
    samples: SampleStore
    _: KW_ONLY
    clock: Clock = SYSTEM_CLOCK

    @property
    def rule(self) -> RunRule:
        return RunRule.of(self.config.idle.min_mib, self.config.max_gap_s)

    async def sweep(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleTimes:
        """Store this sweep's samples, advance the runs, prune a bounded batch; return the idle
        GPUs and since when each holder held its GPU."""
        keep_from = now - self.config.idle.keep_s
        samples = await off_loop(samples_of, snaps, now)  # one per GPU of the fleet
        looked = Looked(tuple(snaps), now, self.config.max_gap_s)  # who holds each GPU now
        try:
            got = await self.samples.advance_idle(
                samples, self.rule, keep_from=keep_from, looked=looked
            )
        except StoreError as exc:  # the sweep stands; idle detection misses this sample
            log.warning(
                "GPU samples not stored, idle GPUs not looked for: %s", exc, extra=DUTY_TURN
            )
            return IdleTimes(now)
        try:
            await self.samples.prune_samples(keep_from, limit=PRUNE_BATCH)
        except StoreError as exc:
            log.warning("old GPU samples not pruned: %s", exc, extra=DUTY_TURN)
        return self._times(got, now)

    async def held(self, snaps: Sequence[NodeSnapshot], now: float) -> Held:
        """Return since when each holder of ``snaps`` has held its GPU, storing nothing."""
        got = await self._ask([], snaps, now, "GPU holders")
        return {} if got is None else got.held

    async def look(self, snaps: Sequence[NodeSnapshot], now: float) -> IdleTimes:
        """Return the idle GPUs of ``snaps`` and since when each holder held its GPU, storing
        nothing (a status)."""
        rule = self.config.idle
        looks = samples_of(snaps, now) if rule.enabled else []
        current = [s for s in looks if held_idle(s, rule.min_mib)]
        got = await self._ask(current, snaps, now, "idle GPUs") if current else None
        return IdleTimes(now) if got is None else self._times(got, now)

    async def _ask(
        self, current: list[GpuSample], snaps: Sequence[NodeSnapshot], now: float, what: str
    ) -> IdleNow | None:
        """Return what the store would fold of ``current`` (None: it failed), storing nothing."""
        try:
            return await self.samples.idle_since(
                current,
                self.rule,
                keep_from=now - self.config.idle.keep_s,
                looked=Looked(tuple(snaps), now, self.config.max_gap_s),
            )
        except StoreError as exc:
            log.warning("%s not looked for: %s", what, exc, extra=DUTY_TURN)
            return None

    def _times(self, got: IdleNow, now: float) -> IdleTimes:
        rule = self.config.idle
        window = rule.window_s - TIME_SLACK_S
        since = got.gpus if rule.enabled else {}
        gpus = {k: round(now - s, 3) for k, s in since.items() if now - s >= window}
        return IdleTimes(now, gpus, got.held)

    async def gpu_hours(self, snapshots: Sequence[NodeSnapshot]) -> dict[str, float]:
        """Return the GPU-hours each owner holds idle now, for ``snapshots`` (the Home tab)."""
        now = self.clock.now()
        times = await self.look(snapshots, now)
        if not times.gpus:
            return {}
        found = find(
            snapshots,
            {},
            self.config,
            protection=self.protection,
            idle=times.gpus,
            held=times.held,
            at=now,
        )
        return held_idle_hours(found)
