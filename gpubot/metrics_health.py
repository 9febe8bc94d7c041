"""The GPU health series of the last sweep (issue 27), beside ``metrics``' GPU gauges.

``gpubot_gpu_remapped_rows_pending{node,gpu,uuid}`` (1: a remapped row or retired page waits for
a reset) and ``gpubot_gpu_throttled{node,gpu,uuid,reason}`` (1 while the reason is active). A GPU
whose health was not read, or whose field is ``[N/A]``, has no series: a 0 would look healthy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from gpubot.core.health import REASON_WORDS
from gpubot.core.models import NodeSnapshot


def health_families(snaps: Sequence[NodeSnapshot]) -> Iterator[Metric]:
    """Yield the health gauges of ``snaps`` (the last sweep's)."""
    pending = GaugeMetricFamily(
        "gpubot_gpu_remapped_rows_pending",
        "1 while a remapped row (or retired page) waits for a GPU reset, at the last sweep",
        labels=["node", "gpu", "uuid"],
    )
    throttled = GaugeMetricFamily(
        "gpubot_gpu_throttled",
        "1 while the GPU's clocks are slowed for this reason, at the last sweep",
        labels=["node", "gpu", "uuid", "reason"],
    )
    for s in snaps:
        for g in s.gpus:
            h = g.health
            if h is None:
                continue
            labels = [s.node, str(g.index), g.uuid]
            said = [v for v in (h.remap_pending, h.retired_pending) if v is not None]
            if said:
                pending.add_metric(labels, float(any(said)))
            if h.temperature_c is not None or h.slowdown:  # the reasons were read
                for r in REASON_WORDS:
                    throttled.add_metric([*labels, r], float(r in h.slowdown))
    yield pending
    yield throttled
