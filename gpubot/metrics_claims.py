"""``gpubot_gpu_claimed{node,gpu,user}``: 1 for each GPU claimed as the claims' duty last read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ClaimGauge(Collector):
    """The active claims, swapped in whole so that a scrape sees one reading."""

    def __init__(self) -> None:
        self.claims: tuple[tuple[str, int, str], ...] = ()

    def set(self, claims: Iterable[tuple[str, int, str]]) -> None:
        """Replace the claims shown: (node, gpu, user) each."""
        self.claims = tuple(sorted(claims))

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "gpubot_gpu_claimed", "GPUs claimed now (1 per claim)", labels=["node", "gpu", "user"]
        )
        for node, gpu, user in self.claims:
            fam.add_metric([node, str(gpu), user], 1.0)
        yield fam
