"""Prometheus metrics (the only module importing ``prometheus_client``).

GPU series come from one snapshot swapped in whole, so a scrape never sees half a sweep. A node
that did not answer, or a health field not read, has no series: a stale number or a 0 would
look healthy. ``gpubot_gpu_holder_memory_bytes`` has one series per holder (user and workload)
of a GPU at the last sweep: a holder gone is a series gone, so its cardinality follows holders,
not GPUs x jobs over time. ``watch_loop`` records how late each of its wake-ups came: work
that holds the loop that long delays every Slack acknowledgement queued behind it (Slack
waits 3 s).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from gpubot.core.flags import owner_label
from gpubot.core.health.kinds import KINDS
from gpubot.core.health.state import REASON_WORDS
from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.text import cut, one_line
from gpubot.core.workload import named, short_name
from gpubot.errors import ConfigError
from gpubot.metrics_claims import ClaimGauge

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SWEEP_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
GPU_GAUGES: tuple[tuple[str, str, str, Callable[[int], float]], ...] = (
    (
        "gpubot_gpu_memory_used_bytes",
        "GPU memory in use at the last sweep",
        "memory_used_mib",
        lambda mib: mib * MIB,
    ),
    ("gpubot_gpu_memory_total_bytes", "GPU memory size", "memory_total_mib", lambda mib: mib * MIB),
    (
        "gpubot_gpu_utilization_ratio",
        "GPU utilisation at the last sweep (0-1)",
        "utilization_pct",
        lambda pct: pct / 100.0,
    ),
)
HOLDER_LABEL_MAX = 64  # characters of a holder's user or workload label: a value stays bounded
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
        for name, help_, field, scale in GPU_GAUGES:
            fam = GaugeMetricFamily(name, help_, labels=["node", "gpu", "uuid"])
            for s in snaps:
                for g in s.gpus:
                    value = getattr(g, field)
                    if value is not None:  # not read: no series, never a healthy-looking 0
                        fam.add_metric([s.node, str(g.index), g.uuid], scale(value))
            yield fam
        yield holder_family(snaps)
        yield from health_families(snaps)
        fam = GaugeMetricFamily(
            "gpubot_findings_open", "Confirmed open sweep findings", labels=["kind"]
        )
        for kind, n in sorted(findings.items()):
            fam.add_metric([kind], n)
        yield fam


def holder_labels(p: GpuProcess) -> tuple[str, str]:
    """Return the ``user`` and ``workload`` labels of a holder: whose job it is (its workload's
    owner, else its user), and its workload's short form (``docker:train``, ``slurm:8812.0``),
    else its process name; printable (``\\xNN``) and cut, as tables show them."""
    w = p.workload
    work = short_name(w) if w is not None and named(w) else p.process_name or "?"
    return cut(one_line(owner_label(p)), HOLDER_LABEL_MAX), cut(one_line(work), HOLDER_LABEL_MAX)


def holder_family(snaps: Sequence[NodeSnapshot]) -> Metric:
    """The memory each holder of a GPU uses, one series per (GPU, user, workload): processes of
    one holder are summed; a process whose memory nvidia-smi did not say adds nothing, and a
    holder with none said has no series (never a 0 that reads as "holds nothing")."""
    fam = GaugeMetricFamily(
        "gpubot_gpu_holder_memory_bytes",
        "GPU memory each holder (user, workload) uses, at the last sweep",
        labels=["node", "gpu", "uuid", "user", "workload"],
    )
    for s in snaps:
        for g in s.gpus:
            held: dict[tuple[str, str], int] = {}
            for p in s.on_gpu(g.index):
                if p.used_memory_mib is not None:
                    key = holder_labels(p)
                    held[key] = held.get(key, 0) + p.used_memory_mib
            for (user, work), mib in sorted(held.items()):
                fam.add_metric([s.node, str(g.index), g.uuid, user, work], mib * MIB)
    return fam


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
        self.claimed.set(claims)

    def count_reset(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` GPUs whose reset ended as ``outcome`` (freed, stuck, refused ...)."""
        self.resets.labels(outcome=outcome).inc(n)

    def observe_stall(self, seconds: float) -> None:
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
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
