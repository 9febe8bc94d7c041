"""What ``App.running`` uses besides the app: its options (``Serving``), what it reports back
(``Running``), serving the metrics and settling the heap. Light: no library is imported here."""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpubot.config import Settings

if TYPE_CHECKING:
    from gpubot.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """How ``App.running`` runs: the sweeps (off: another replica sweeps), the metrics' port
    (None: ``[metrics] port``, if any) and address, how often approvals expire, and whether the
    heap made at start-up is frozen out of the collector's full passes (``settle_heap``)."""

    sweeps: bool = True
    metrics_port: int | None = None
    metrics_host: str | None = None
    expire_every_s: float = 30.0
    settle_heap: bool = True
    # More duties on the one scheduler: (job, every_s, name), e.g. the claims' (issue 26).
    duties: tuple[tuple[Callable[[], Awaitable[Any]], float, str], ...] = ()


@dataclass(frozen=True)
class Running:
    """What ``App.running`` started: the metrics' bound port (None: not served)."""

    metrics_port: int | None


SERVING = Serving()  # gpubot serve's defaults


def serve_metrics(metrics: Metrics | None, settings: Settings, options: Serving) -> int | None:
    """Serve the metrics on the option's port, else ``[metrics] port``, if either; return the
    bound port."""
    cfg = settings.metrics
    port = cfg.port if options.metrics_port is None else options.metrics_port
    host = options.metrics_host or cfg.host
    if port is None or metrics is None:
        return None
    bound = metrics.serve(port, host)
    log.info("metrics at http://%s:%d/metrics", host, bound)
    return bound


def settle_heap() -> None:
    """Keep what start-up made (modules, settings, the bolt app: alive as long as the process)
    out of the garbage collector's full passes from now on.

    Each full pass walks every tracked object with the event loop held. Measured in-process
    (the bot, its fake Slack and sender in one process; CPU time per loop callback) while it
    answered 100 ``/gpu status all`` over 64 nodes: one full pass took 67-87 ms of CPU, the only
    callback over 10 ms; with what existed before the burst frozen, 26 ms.
    """
    gc.collect()
    gc.freeze()
