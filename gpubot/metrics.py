"""Prometheus metrics (the only module importing ``prometheus_client``).

GPU series come from one snapshot swapped in whole, so a scrape never sees half a sweep. A node
that did not answer, or a health field not read, has no series: a stale number or a 0 would
look healthy. ``watch_loop`` records how late each of its wake-ups came: work that holds the
loop that long delays every Slack acknowledgement queued behind it (Slack waits 3 s).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from gpubot.core.health.kinds import KINDS
from gpubot.core.health.state import REASON_WORDS
from gpubot.core.models import NodeSnapshot
from gpubot.errors import ConfigError
from gpubot.metrics_claims import ClaimGauge

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SWEEP_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_TICK_S = 0.02  # how often watch_loop wakes: a stall shorter than this is not seen


class _LastSweep(Collector):
    """GPU gauges and open findings, from the last sweep's snapshots."""

    def __init__(self) -> None:
        # Swapped in whole by one assignment, so a scrape sees one sweep's numbers.
        self.state: tuple[tuple[NodeSnapshot, ...], dict[str, int]] = (
            (),
            {k.value: 0 for k in KINDS},
        )

    def collect(self) -> Iterator[Metric]:
        snaps, findings = self.state
        used = GaugeMetricFamily(
            "gpubot_gpu_memory_used_bytes",
            "GPU memory in use at the last sweep",
            labels=["node", "gpu", "uuid"],
        )
        total = GaugeMetricFamily(
            "gpubot_gpu_memory_total_bytes", "GPU memory size", labels=["node", "gpu", "uuid"]
        )
        util = GaugeMetricFamily(
            "gpubot_gpu_utilization_ratio",
            "GPU utilisation at the last sweep (0-1)",
            labels=["node", "gpu", "uuid"],
        )
        for s in snaps:
            for g in s.gpus:
                labels = [s.node, str(g.index), g.uuid]
                if g.memory_used_mib is not None:
                    used.add_metric(labels, g.memory_used_mib * MIB)
                if g.memory_total_mib is not None:
                    total.add_metric(labels, g.memory_total_mib * MIB)
                if g.utilization_pct is not None:
                    util.add_metric(labels, g.utilization_pct / 100.0)
        yield used
        yield total
        yield util
        yield from health_families(snaps)
        fam = GaugeMetricFamily(
            "gpubot_findings_open", "Confirmed open sweep findings", labels=["kind"]
        )
        for kind, n in sorted(findings.items()):
            fam.add_metric([kind], n)
        yield fam


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
            if h.reasons_read:
                for r in REASON_WORDS:
                    throttled.add_metric([*labels, r], float(r in h.slowdown))
    yield pending
    yield throttled


class Metrics:
    """gpubot's metrics in a registry of their own (several can live in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._last = _LastSweep()
        self.registry.register(self._last)
        self.claimed = ClaimGauge()  # gpubot_gpu_claimed
        self.registry.register(self.claimed)
        self.resets = Counter(
            "gpubot_resets", "GPUs reset, by outcome", ["outcome"], registry=self.registry
        )
        self.sweep_duration = Histogram(
            "gpubot_sweep_duration_seconds",
            "How long sweeps took",
            buckets=SWEEP_BUCKETS,
            registry=self.registry,
        )
        self.node_failures = Counter(
            "gpubot_node_failures",
            "Sweeps in which a node gave no usable answer",
            ["node"],
            registry=self.registry,
        )
        self.xids = Counter(  # exported as gpubot_gpu_xid_total
            "gpubot_gpu_xid",
            "Xid (and SXid: xid=sxid:N) lines the sweeps read from the kernel log, by GPU",
            ["node", "gpu", "xid"],
            registry=self.registry,
        )
        self.loop_stalls = Histogram(
            "gpubot_event_loop_stall_seconds",
            "How late each of the event-loop watch's wake-ups came (the loop was held that long)",
            buckets=STALL_BUCKETS,
            registry=self.registry,
        )
        self.loop_max_stall = Gauge(
            "gpubot_event_loop_max_stall_seconds",
            "The longest event-loop stall since the watch began",
            registry=self.registry,
        )
        self.max_stall_s = 0.0
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def observe_sweep(
        self,
        snapshots: Sequence[NodeSnapshot],
        failed: Sequence[str],
        seconds: float,
        open_findings: Mapping[str, int],
    ) -> None:
        """Record one sweep: its snapshots, failing nodes, duration and open findings."""
        counts = {k.value: 0 for k in KINDS}
        counts.update(open_findings)
        self._last.state = (tuple(snapshots), counts)
        self.sweep_duration.observe(seconds)
        for node in failed:
            self.node_failures.labels(node=node).inc()

    def count_xid(self, node: str, gpu: str, xid: str) -> None:
        """Count one Xid line a sweep read (``gpu``: its index, "-" when the node's)."""
        self.xids.labels(node=node, gpu=gpu, xid=xid).inc()

    def observe_claims(self, claims: Iterable[tuple[str, int, str]]) -> None:
        """Record the GPUs claimed now: (node, gpu, user) each."""
        self.claimed.set(claims)

    def count_reset(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` GPUs whose reset ended as ``outcome`` (freed, stuck, refused ...)."""
        self.resets.labels(outcome=outcome).inc(n)

    def observe_stall(self, seconds: float) -> None:
        """Record that the event loop answered ``seconds`` late."""
        self.loop_stalls.observe(seconds)
        if seconds > self.max_stall_s:
            self.max_stall_s = seconds
            self.loop_max_stall.set(seconds)

    async def watch_loop(self, every_s: float = LOOP_TICK_S) -> None:
        """Record how late each ``every_s`` wake-up comes, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(every_s)
            self.observe_stall(max(0.0, loop.time() - start - every_s))

    def text(self) -> str:
        """Return the exposition text (what a scrape gets)."""
        return generate_latest(self.registry).decode()

    # -- HTTP --------------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; return the bound port."""
        if self._server is not None:
            raise ConfigError("metrics are served already")
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}: "
                "choose another port (--metrics-port, [metrics] port) or stop what holds it"
            ) from None
        self._server, self._thread = server, thread
        return int(server.server_port)

    def close(self) -> None:
        """Stop serving."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
