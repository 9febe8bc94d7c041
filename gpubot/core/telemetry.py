"""The fleet summary read from the site's Prometheus (dcgm-exporter's series), pure.

``[prometheus]`` names the server (or Thanos/Mimir: the same ``/api/v1/query``), the environment
variable of its bearer token, the label names (dcgm-exporter's by default) and how old an answer
may be. A node reads its summary from there when one of its groups says
``telemetry = "prometheus"``; everything else (holders, every signal, stop, reset and verify)
stays on SSH: a scrape narrows where gpubot looks, it never decides.

The summary is a few instant queries over the whole server, each GPU's series folded to one by
``max by`` its node and UUID (MIG instances repeat their GPU's fields, and pods add labels); the
memory used, which names the GPUs, also keeps their index and model. The other answers carry the
node and UUID alone: at 20,000 GPUs each label repeated in every answer is megabytes to send and
decode (``benchmarks/prom_summary.py``). Each GPU's age is Prometheus's own evaluation time less
its oldest sample of the fields read (``timestamp()``): no clock of ours is compared with the
server's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpubot.core import durations

PROMETHEUS, SSH = "prometheus", "ssh"
TELEMETRIES = (SSH, PROMETHEUS)


@dataclass(frozen=True)
class PromLabels:
    """The label names of a GPU's series (dcgm-exporter's defaults)."""

    node: str = "Hostname"
    uuid: str = "UUID"
    gpu: str = "gpu"
    model: str = "modelName"

    def by(self) -> str:
        """The labels of the answer that names the GPUs (``used``)."""
        return f"{self.node}, {self.uuid}, {self.gpu}, {self.model}"

    def key(self) -> str:
        """The labels of every other answer: a GPU is its node and UUID."""
        return f"{self.node}, {self.uuid}"


@dataclass(frozen=True)
class PromSettings:
    """``[prometheus]``: the server, its token's variable, the labels, the bound on an answer's
    age (older is read over SSH instead) and how long a query may take."""

    url: str | None = None  # "http://prometheus:9090"; None: no Prometheus
    token_env: str = "GPUBOT_PROMETHEUS_TOKEN"  # unset: no Authorization header
    labels: PromLabels = field(default_factory=PromLabels)
    max_age_s: float = 120.0
    timeout_s: float = 10.0


# The fields of the summary, each one query: (field, dcgm-exporter's metric).
FIELDS = (
    ("used", "DCGM_FI_DEV_FB_USED"),
    ("free", "DCGM_FI_DEV_FB_FREE"),
    ("reserved", "DCGM_FI_DEV_FB_RESERVED"),
    ("util", "DCGM_FI_DEV_GPU_UTIL"),
    ("xid", "DCGM_FI_DEV_XID_ERRORS"),
)
NAMES = "used"  # the field whose answer names the GPUs: their index and model
# The age of a GPU's data: its memory reading's sample time (``timestamp()`` says a sample's own
# time only of a plain selector, so it is asked of the metric alone). Its other fields come from
# the same scrape of the same exporter, so they have that scrape's time; one the exporter stops
# giving is marked stale at the next scrape and is no longer answered: a GPU whose ``FRESH``
# fields are not all answered is as old as can be (never fresh). One query of the times, not
# one a field: each is 20,000 series to send and decode at 20,000 GPUs.
AGED = "DCGM_FI_DEV_FB_USED"
FRESH = ("free", "util")
AGE = "age"


def queries(labels: PromLabels) -> dict[str, str]:
    """Return the PromQL of each field of the summary, and of the GPUs' sample times (``age``)."""
    by, key = labels.by(), labels.key()
    out = {name: f"max by ({by if name == NAMES else key}) ({metric})" for name, metric in FIELDS}
    out[AGE] = f"min by ({key}) (timestamp({AGED}))"
    return out


@dataclass(frozen=True)
class PromGpu:
    """One GPU as its exporter's last scrape said."""

    index: int
    uuid: str
    model: str
    used_mib: int | None
    total_mib: int | None  # used + free + reserved (nvidia-smi's total)
    utilization_pct: int | None
    last_xid: int | None  # DCGM's last Xid; None: none (0) or not exported
    age_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.model,
            "memory_used_mib": self.used_mib,
            "memory_total_mib": self.total_mib,
            "utilization_pct": self.utilization_pct,
            "last_xid": self.last_xid,
            "age_s": round(self.age_s, 1),
        }


@dataclass(frozen=True)
class PromNode:
    """One node's GPUs from Prometheus; its age is its oldest GPU's."""

    node: str
    gpus: tuple[PromGpu, ...]

    @property
    def age_s(self) -> float:
        return max((g.age_s for g in self.gpus), default=math.inf)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "age_s": round(self.age_s, 1),
            "gpus": [g.to_dict() for g in self.gpus],
        }


def _number(value: Any) -> float | None:
    """A sample's value (``[time, "text"]``); None for NaN, ±Inf or what is not a number."""
    try:
        x = float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return x if math.isfinite(x) else None


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def summarize(
    results: Mapping[str, Sequence[Mapping[str, Any]]], labels: PromLabels
) -> dict[str, PromNode]:
    """Fold the queries' result vectors into each node's GPUs, by the node label's value.

    The ``used`` answer names the GPUs: a series without the node, UUID or a whole-number GPU
    index is not a GPU of a node, left out, and so are the other answers' series of a GPU it
    does not name. A GPU is one whose memory was read; the other fields may be missing (and
    where a ``FRESH`` one is, the GPU is never fresh)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    nk, uk, gk, mk = labels.node, labels.uuid, labels.gpu, labels.model
    for series in results.get(NAMES, ()):
        metric = series.get("metric", {})
        node, uuid, index = metric.get(nk), metric.get(uk), metric.get(gk)
        if not node or not uuid or not isinstance(index, str) or not index.isdigit():
            continue
        gpu = seen.setdefault((node, uuid), {"index": int(index), "model": metric.get(mk, "")})
        gpu[NAMES] = _number(series.get("value"))
    for name, vector in results.items():
        if name == NAMES:
            continue
        for series in vector:
            metric = series.get("metric", {})
            known = seen.get((metric.get(nk), metric.get(uk)))
            if known is None:
                continue
            value = series.get("value")
            known[name] = _age(value) if name == AGE else _number(value)
    return _nodes(seen)


def _age(value: Any) -> float | None:
    """A ``timestamp()`` sample's age: its evaluation time less its value."""
    t = _number(value)
    now = _number([None, value[0]]) if isinstance(value, list) and value else None
    return None if t is None or now is None else max(0.0, now - t)


def _nodes(seen: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, PromNode]:
    nodes: dict[str, list[PromGpu]] = {}
    for (node, uuid), g in seen.items():
        used, free = g.get(NAMES), g.get("free")
        if used is None:
            continue
        total = None if free is None else used + free + (g.get("reserved") or 0.0)
        age = g.get(AGE) if all(f in g for f in FRESH) else None  # answered, if not a number
        nodes.setdefault(node, []).append(
            PromGpu(
                index=g["index"],
                uuid=uuid,
                model=g["model"],
                used_mib=_int(used),
                total_mib=_int(total),
                utilization_pct=_int(g.get("util")),
                last_xid=_int(g.get("xid")) or None,
                age_s=math.inf if age is None else age,
            )
        )
    return {
        n: PromNode(n, tuple(sorted(gs, key=lambda g: (g.index, g.uuid))))
        for n, gs in sorted(nodes.items())
    }


# -- the sweep's candidates -------------------------------------------------------------------
# Why Prometheus names a GPU to a sweep, each one query; the sweep then probes its node over SSH
# and decides from that probe alone.
IDLE_WINDOW = "util 0 with memory held for the idle window"
HELD_QUIET = "memory held with no activity"
XID_CHANGED = "its last Xid changed"
REMAP_PENDING = "remapped rows pending"
ECC_GREW = "double-bit ECC errors grew"
VANISHED = "gone from its exporter"
UNREAD = "utilisation or memory not in the scrape"


@dataclass(frozen=True)
class CandidateRule:
    """What makes a GPU a sweep's candidate: the idle window, the sweep interval (the span of
    the Xid, ECC and vanishing looks) and the memory that counts as held (MiB)."""

    idle_window_s: float
    interval_s: float
    held_mib: int


def _span(seconds: float) -> str:
    """A PromQL range: whole seconds, at least one (durations' exact form is PromQL's too)."""
    return durations.format(max(1.0, seconds))


def candidate_queries(labels: PromLabels, rule: CandidateRule) -> dict[str, str]:
    """Return the PromQL of each reason a GPU is a candidate. Every side is folded ``max by``
    the GPU's labels first, so pod labels or MIG instances never keep two sides apart."""
    by = labels.by()
    window, interval = _span(rule.idle_window_s), _span(rule.interval_s)

    def per_gpu(expr: str) -> str:
        return f"max by ({by}) ({expr})"

    held = f"{per_gpu('DCGM_FI_DEV_FB_USED')} >= {rule.held_mib}"
    return {
        IDLE_WINDOW: f"{per_gpu(f'max_over_time(DCGM_FI_DEV_GPU_UTIL[{window}])')} == 0 and on "
        f"({by}) {per_gpu(f'min_over_time(DCGM_FI_DEV_FB_USED[{window}])')} >= {rule.held_mib}",
        HELD_QUIET: f"{per_gpu('DCGM_FI_DEV_GPU_UTIL')} == 0 and on ({by}) {held}",
        XID_CHANGED: f"{per_gpu(f'changes(DCGM_FI_DEV_XID_ERRORS[{interval}])')} > 0",
        REMAP_PENDING: f"{per_gpu('DCGM_FI_DEV_ROW_REMAP_PENDING')} > 0",
        ECC_GREW: f"{per_gpu(f'increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{interval}])')} > 0",
        VANISHED: f"{per_gpu(f'max_over_time(DCGM_FI_DEV_FB_USED[{interval}])')} unless on "
        f"({by}) {per_gpu('DCGM_FI_DEV_FB_USED')}",
    }


def candidates(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    labels: PromLabels,
    nodes: Mapping[str, PromNode],
) -> dict[str, tuple[str, ...]]:
    """Return why each node is a candidate: ``"GPU i: reason"`` lines, from the candidate
    queries' answers (by reason) and from the summary's GPUs that lack utilisation or memory
    (what cannot be judged is looked at). A series without the node label or a whole-number
    GPU index names nothing: it is no GPU of a node."""
    why: dict[str, set[tuple[int, str]]] = {}
    for reason, vector in results.items():
        for series in vector:
            metric = series.get("metric", {})
            node, index = metric.get(labels.node), metric.get(labels.gpu)
            if node and isinstance(index, str) and index.isdigit():
                why.setdefault(node, set()).add((int(index), reason))
    for node in nodes.values():
        for g in node.gpus:
            if g.used_mib is None or g.utilization_pct is None:
                why.setdefault(node.node, set()).add((g.index, UNREAD))
    return {n: tuple(f"GPU {i}: {r}" for i, r in sorted(got)) for n, got in sorted(why.items())}
