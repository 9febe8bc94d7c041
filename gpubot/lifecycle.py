"""What ``App.running`` uses besides the app: its options (``Serving``), what it reports back
(``Running``), serving the metrics and settling the heap (at start, and around sweeps). Light: no
library is imported here."""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpubot.config import Settings

if TYPE_CHECKING:
    from gpubot.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """How a long-running gpubot (``gpubot serve``) serves the fleet: its sweeps (off: another
    replica sweeps), its metrics (off: another composition of the process serves them), their
    port (None: ``[metrics] port``, if any) and address, how often
    approvals expire, whether the start-up heap is frozen out of the collector's full passes
    (``settle_heap``), and when the schedules first run (None: a few seconds after start)."""

    sweeps: bool = True
    metrics: bool = True
    metrics_port: int | None = None
    metrics_host: str | None = None
    expire_every_s: float = 30.0
    settle_heap: bool = True
    first_after_s: float | None = None


@dataclass(frozen=True)
class Running:
    """What ``App.running`` started: the metrics' bound port (None: not served)."""

    metrics_port: int | None


def serve_metrics(metrics: Metrics | None, settings: Settings, options: Serving) -> int | None:
    """Serve the metrics on the option's port, else ``[metrics] port``, if either; return the
    bound port."""
    cfg = settings.metrics
    port = cfg.port if options.metrics_port is None else options.metrics_port
    host = options.metrics_host or cfg.host
    if port is None or metrics is None or not options.metrics:
        return None
    bound = metrics.serve(port, host)
    log.info("metrics at http://%s:%d/metrics", host, bound)
    return bound


def settle_heap() -> None:
    """Keep what start-up made (modules, settings, the bolt app: alive as long as the process)
    out of the collector's full passes, each of which walks every tracked object with the event
    loop held (``benchmarks/README.md``)."""
    gc.collect()
    gc.freeze()


NO_FULL_PASS = 1_000_000  # the third threshold while a sweep runs: no full pass


class SweepHeap:
    """The garbage collector around sweeps: no full pass while one runs, its survivors frozen
    after.

    A full pass walks every tracked object with the interpreter lock held, so the event loop
    (and a Slack ack) waits throughout, and a large sweep's long-lived objects set off such
    passes. So while a sweep runs the third threshold is lifted (young passes, which walk only
    what is new, still run); after it the young generations are collected and what survived is
    frozen. Frozen objects are still freed by their reference counts (how a sweep's snapshots go
    when the next replaces them); only garbage cycles frozen in the old generation would stay.
    A valve bounds them: when the blocks in use grow past ``slack`` times what the first sweep
    left plus ``floor``, one full pass runs (unfreeze, collect, freeze) and is logged. It counts
    blocks (a sum over the allocator's pools), never frozen objects: ``gc.get_freeze_count``
    walks them all (``benchmarks/README.md``). Process-wide, so only a serving gpubot has it;
    overlapping sweeps share one lift.
    """

    def __init__(self, *, slack: float = 2.0, floor: int = 200_000) -> None:
        self.slack = slack
        self.floor = floor
        self.baseline: int | None = None  # the blocks in use after the first sweep
        self.full_passes = 0  # the valve's passes so far
        self.settle_s = 0.0  # how long the latest settle held the loop (the benchmark shows it)
        self._depth = 0
        self._saved: tuple[int, int, int] | None = None

    @contextmanager
    def around(self) -> Iterator[None]:
        """Run the body (a sweep) with no full pass; settle the heap when the last one ends."""
        if self._depth == 0:
            self._saved = gc.get_threshold()
            t0, t1, _ = self._saved
            gc.set_threshold(t0, t1, NO_FULL_PASS)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                if self._saved is not None:
                    gc.set_threshold(*self._saved)
                self.settle()

    def settle(self) -> None:
        """Collect the young generations, freeze what survived; run the valve if it is due."""
        t0 = time.perf_counter()
        gc.collect(1)
        gc.freeze()
        blocks = sys.getallocatedblocks()  # never gc.get_freeze_count(): a walk of them all
        self.settle_s = time.perf_counter() - t0
        if self.baseline is None:
            self.baseline = blocks
            return
        if blocks <= self.baseline * self.slack + self.floor:
            return
        t0 = time.perf_counter()
        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self.full_passes += 1
        self.baseline = sys.getallocatedblocks()
        log.info(
            "heap: one full collection after sweeps (%d blocks in use, %d objects freed, %.0f ms)",
            blocks,
            freed,
            (time.perf_counter() - t0) * 1000,
        )
