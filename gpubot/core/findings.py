"""Sweep findings: snapshots + failures + thresholds + time → findings with stable keys.

Pure (time passed in). Which GPUs are idle comes from earlier sweeps' samples
(``core.usage.idle``); the alert state of each finding is ``core.alerting``. Settings:
``[sweep]``, ``[alerts]``, ``[metrics]`` (see ``gpubot.example.toml``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from gpubot.core import durations
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.protect import Protection, is_protected
from gpubot.core.usage.holder_runs import HolderKey, holders_idle
from gpubot.core.usage.idle import (
    MAX_GAP_INTERVALS,
    IdleRule,
    holder_owner,
    idle_summary,
    is_idle_holder,
)
from gpubot.core.workload import OTHER, short_name
from gpubot.errors import CommandTimeout, GpubotError, ParseError, ProbeError

GONE = "gone"  # holder suffix of a process nvidia-smi lists but /proc does not know


class FindingKind(str):
    """One kind of trouble a sweep finds: a value declared next to the check that raises it, and
    named in the list of all kinds (``core.health.kinds``).

    A kind is its stored name (a ``str``): the database, alert keys, JSON and the audit log hold
    that name, so it never changes. ``reset``: its alert offers the Reset button; ``gpu_reset``:
    that reset is of the whole GPU (no holder to stop), so the sweep asks the node what it would
    touch. ``event``: read once (a kernel log line), so it is real when first seen. ``node``: the
    node gave no usable answer; it clears once the node answers or fails in another way.
    ``ladder``: its holder climbs the reclaim ladder (told, reminded, named, then offered to
    on-call) instead of the plain alert. ``drain``: on a node a scheduler owns, its alert offers
    to drain the node (the Drain button); a kind whose findings differ (an Xid's code) says so
    on each finding instead (``Finding.drain``).
    """

    heading: str  # the kind in words (``str.title`` is taken)
    reset: bool
    gpu_reset: bool
    event: bool
    node: bool
    ladder: bool
    drain: bool

    def __new__(
        cls,
        name: str,
        heading: str,
        *,
        reset: bool = False,
        gpu_reset: bool = False,
        event: bool = False,
        node: bool = False,
        ladder: bool = False,
        drain: bool = False,
    ) -> FindingKind:
        kind = super().__new__(cls, name)
        kind.__dict__.update(
            heading=heading,
            reset=reset,
            gpu_reset=gpu_reset,
            event=event,
            node=node,
            ladder=ladder,
            drain=drain,
        )
        return kind

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a finding kind is fixed")

    @property
    def value(self) -> str:
        """Return the stored name as a plain ``str``."""
        return str(self)

    def __copy__(self) -> FindingKind:
        return self

    def __deepcopy__(self, memo: object) -> FindingKind:
        return self  # one value per kind, whatever copies it (``asdict``)


ORPHANED_VRAM = FindingKind("orphaned-vram", "orphaned GPU memory", reset=True, gpu_reset=True)
ZOMBIE_PROCESS = FindingKind("zombie-process", "zombie process", reset=True)
HIDDEN_HOLDER = FindingKind("hidden-holder", "hidden GPU holder", reset=True)
IDLE_HOLDER = FindingKind("idle-holder", "idle GPU holder", reset=True, ladder=True)
NODE_UNREACHABLE = FindingKind("node-unreachable", "node unreachable", node=True)
# It answered, too slowly: past a command timeout or the sweep budget.
NODE_SLOW = FindingKind("node-slow", "node too slow to answer", node=True)
SMI_FAILED = FindingKind("smi-failed", "nvidia-smi failed", node=True)
GPU_LOST = FindingKind("gpu-lost", "GPU lost")


@dataclass(frozen=True)
class SweepConfig:
    """The ``[sweep]`` and ``[alerts]`` settings (validated by ``gpubot.config``)."""

    interval_s: float = 300.0
    budget_s: float = 240.0
    orphan_threshold_mib: int = 1024
    idle: IdleRule = field(default_factory=IdleRule)
    reminder_s: float = 21600.0
    channel: str | None = None  # where alerts go: [alerts] channel, else [slack] channel
    health: bool = True  # read the GPUs' health fields each sweep (core.health.state)
    kernel_log: bool = False  # read each node's kernel log for Xid/SXid (core.health.kernlog)
    xid_window_s: float = 3600.0  # an Xid finding stands this long; repeat thresholds count in it
    hung_sweeps: int = 3  # hung-but-busy: looks in a row (core.health.hung); 0: off

    @property
    def max_gap_s(self) -> float:
        """Return the longest gap between two samples that keeps a GPU's idle run going."""
        return MAX_GAP_INTERVALS * self.interval_s


class FindingKey(NamedTuple):
    """The stable identity of a finding: the same trouble on the next sweep has the same key.

    ``holder``: "pid:start_ticks" of the process holding the GPU ("pid:gone" when /proc does
    not know it), the bus id of a lost GPU whose index is unknown, "" otherwise.
    """

    node: str
    gpu: int | None
    kind: str  # a FindingKind's stored name
    holder: str = ""

    def text(self) -> str:
        """Return the key as one string (what the database indexes and buttons carry)."""
        gpu = "-" if self.gpu is None else str(self.gpu)
        return json.dumps([self.node, gpu, self.kind, self.holder], separators=(",", ":"))


@dataclass(frozen=True)
class Finding:
    node: str
    gpu: int | None
    kind: FindingKind
    holder: str  # "" (no process), "pid:start_ticks", or "pid:gone"
    summary: str  # one line for a person
    pid: int | None = None
    user: str | None = None  # the process's user on the node
    memory_mib: int | None = None
    owner: str | None = None  # whose job it is: its workload's owner, else ``user``
    workload: str | None = None  # its workload's short label (``docker:train``, ``slurm:88``)
    idle_s: float | None = None  # an idle holder: how long it has held its GPU idle so far
    idle_since: float | None = None  # an idle holder: since when (never before it held the GPU)
    next_step: str | None = None  # an Xid's: ``core.health.codes`` (reset when idle, ...)
    # a scheduler's node may be drained for it, whatever its kind says (an Xid's code decides)
    drain: bool = False
    # Who named the node to the sweep, where it was not swept in full over SSH: "named by
    # prometheus (GPU 3: ...), confirmed over ssh". The finding itself is always the probe's.
    source: str | None = None

    @property
    def key(self) -> FindingKey:
        return FindingKey(self.node, self.gpu, self.kind.value, self.holder)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "kind": self.kind.value,
            "holder": self.holder,
            "summary": self.summary,
            "pid": self.pid,
            "user": self.user,
            "memory_mib": self.memory_mib,
            "owner": self.owner,
            "workload": self.workload,
            "idle_hours": None if self.idle_s is None else round(self.idle_s / 3600.0, 2),
            "next_step": self.next_step,
            "source": self.source,
        }


@dataclass(frozen=True)
class NodeFailure:
    kind: FindingKind  # NODE_UNREACHABLE, NODE_SLOW or SMI_FAILED
    reason: str


def classify_failure(exc: GpubotError) -> FindingKind:
    """Return the finding kind of a node's failure: nvidia-smi's own, or the node's.

    A node that was still answering when its time ran out (the command timeout, the sweep
    budget) is slow, not unreachable: calling it down made it flap.
    """
    if isinstance(exc, ProbeError | ParseError):
        return SMI_FAILED
    if isinstance(exc, CommandTimeout):
        return NODE_SLOW
    return NODE_UNREACHABLE


def holder_id(p: GpuProcess) -> str:
    """Return the identity of a holding process: ``pid:start_ticks`` (``pid:gone`` if gone)."""
    return f"{p.pid}:{GONE if p.start_ticks is None else p.start_ticks}"


def find(
    snapshots: Iterable[NodeSnapshot],
    failures: Mapping[str, NodeFailure],
    config: SweepConfig,
    *,
    protection: Protection | None = None,
    idle: Mapping[tuple[str, int], float] | None = None,
    held: Mapping[HolderKey, float] | None = None,
    at: float | None = None,
) -> tuple[Finding, ...]:
    """Return every finding of one sweep, in node then GPU order.

    ``idle``: ``{(node, gpu): seconds held idle}`` at ``at`` (the sweep's time; None: each
    snapshot's) of the GPUs idle for the idle window (``usage.idle.idle_gpus``). Their holders of
    enough memory that have held the GPU that long themselves are idle holders: ``held`` says
    since when each has (``usage.holder_runs``; None: since each process started). Evidence that
    accuses a person is that person's own: a job that came to an idle GPU is not idle for the
    time before it came.
    """
    out: list[Finding] = []
    rule = protection or Protection()
    for snap in snapshots:
        for g in sorted(snap.gpus, key=lambda g: g.index):
            gpu_idle_s = (idle or {}).get((snap.node, g.index))
            mine: Mapping[str, tuple[float, float]] = {}
            if gpu_idle_s is not None:
                now = snap.taken_at if at is None else at
                window = config.idle.window_s - durations.TIME_SLACK_S
                mine = holders_idle(snap, g.index, gpu_idle_s, held, now, window)
            out.extend(_gpu_findings(snap, g, config, rule, mine))
        for bus in snap.lost:  # its index was not said: the node's finding, keyed by bus id
            out.append(_lost(snap.node, None, bus, f"a GPU ({bus})"))
    for node, f in failures.items():
        out.append(Finding(node, None, f.kind, "", f.reason))
    return tuple(out)


def _lost(node: str, gpu: int | None, holder: str, which: str) -> Finding:
    return Finding(node, gpu, GPU_LOST, holder, f"{which} is lost: it needs a reset or a reboot")


def _gpu_findings(
    snap: NodeSnapshot,
    g: GpuInfo,
    config: SweepConfig,
    protection: Protection,
    idle: Mapping[str, tuple[float, float]],
) -> list[Finding]:
    """Return the findings of one GPU (``idle``: its holders' idle seconds and since when)."""
    node = snap.node
    out: list[Finding] = []
    if "lost" in g.flags:  # fell off the bus: nothing else about it can be known
        return [_lost(node, g.index, "", f"GPU {g.index}" + (f" ({g.bus_id})" if g.bus_id else ""))]
    holders = [p for p in snap.on_gpu(g.index) if not is_protected(p, protection)]
    used = g.memory_used_mib
    if not holders and used is not None and used > config.orphan_threshold_mib:
        unseen = " (holders of its device file cannot be seen)" if g.minor is None else ""
        out.append(
            Finding(
                node,
                g.index,
                ORPHANED_VRAM,
                "",
                f"{used} MiB in use and no process holds the GPU{unseen}",
                memory_mib=used,
            )
        )
    for p in holders:
        if snap.hidepid and not p.exists:  # "gone" may only be hidden: no zombie on that evidence
            continue
        idle_s, since = idle.get(holder_id(p), (None, None))
        trouble = _process_trouble(p, g, config, idle_s)
        if trouble is None:
            continue
        kind, summary = trouble
        # only an idle holder carries its idle time
        held: dict[str, Any] = (
            {"idle_s": idle_s, "idle_since": since} if kind == IDLE_HOLDER else {}
        )
        out.append(process_finding(node, p.gpu_index, kind, p, summary, **held))
    return out


def process_finding(
    node: str, gpu: int | None, kind: FindingKind, p: GpuProcess, summary: str, **more: Any
) -> Finding:
    """Return a finding about the one process ``p``: its identity (pid and start ticks), user,
    memory, owner and workload are that process's own; ``more``: further fields."""
    f = Finding(
        node,
        gpu,
        kind,
        holder_id(p),
        summary,
        pid=p.pid,
        user=p.user,
        memory_mib=p.used_memory_mib,
        owner=holder_owner(p),
        workload=workload_label(p),
    )
    return replace(f, **more) if more else f


def workload_label(p: GpuProcess) -> str | None:
    """Return the short label of a process's workload, if it names one (``docker:train``)."""
    w = p.workload
    return None if w is None or w.kind == OTHER else short_name(w)


def _process_trouble(
    p: GpuProcess, g: GpuInfo, config: SweepConfig, idle_s: float | None
) -> tuple[FindingKind, str] | None:
    """Return the kind and summary of what is wrong with one holder, or None."""
    who = f"pid {p.pid} {p.process_name}" + (f" ({p.user})" if p.user else "")
    mem = "" if p.used_memory_mib is None else f", {p.used_memory_mib} MiB"
    if p.state == "Z":
        return ZOMBIE_PROCESS, f"{who} is a zombie (state Z){mem}"
    if p.state == "D":
        where = f" in {p.wchan}" if p.wchan else ""
        return ZOMBIE_PROCESS, f"{who} is stuck in the kernel (state D{where}){mem}"
    if p.visible_to_nvidia_smi and not p.exists:
        return ZOMBIE_PROCESS, f"{who} is listed by nvidia-smi but gone from /proc{mem}"
    if p.hidden and p.exists:
        label = workload_label(p)
        seen = f" in {label}" if label else ""
        return (
            HIDDEN_HOLDER,
            f"{who} holds the device file{seen} but nvidia-smi does not list it",
        )
    if idle_s is not None and config.idle.enabled and is_idle_holder(p, config.idle):
        return IDLE_HOLDER, idle_summary(p, g, durations.format(idle_s, "people"))
    return None
