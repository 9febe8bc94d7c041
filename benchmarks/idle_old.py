"""The idle check as it was before idle runs: reread every idle GPU's whole sample history.

Kept here, outside the product, so that the benchmark can run it beside the incremental runs
(``benchmarks/scale_store.py``) and the tests can check that both give the same answers
(``tests/contract/test_store_idle_runs.py``). It is ``IdleAccounting.idle`` of 0005's days:
two reads, each only of the GPUs held idle now, the window and then every sample kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.core.findings import SweepConfig
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import SampleStore
from gpubot.core.usage.idle import held_idle, idle_gpus, samples_of


async def old_idle(
    samples: SampleStore, config: SweepConfig, snaps: Sequence[NodeSnapshot], now: float
) -> dict[tuple[str, int], float]:
    """Return ``{(node, gpu): seconds held idle}`` from the samples' history (the old way)."""
    rule, gap = config.idle, config.max_gap_s
    if not rule.enabled:
        return {}
    current = [s for s in samples_of(snaps, now) if held_idle(s, rule.min_mib)]
    if not current:
        return {}
    window = await samples.samples_since(
        now - rule.window_s - gap, gpus={(s.node, s.gpu) for s in current}
    )
    idle = idle_gpus(current, window, rule, max_gap_s=gap)
    if not idle:
        return {}
    kept = await samples.samples_since(now - rule.keep_s, gpus=idle.keys())
    still = [s for s in current if (s.node, s.gpu) in idle]
    return idle_gpus(still, kept, rule, max_gap_s=gap)
