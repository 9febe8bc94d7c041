"""Sweep findings: snapshots + failures + thresholds + time → findings with stable keys.

Pure (standard library only, time passed in). Also the decisions a sweep takes on each finding's
alert state: confirm (seen in two consecutive sweeps), alert, remind, resolve, snooze. Which GPUs
are idle comes from the samples of earlier sweeps (``gpubot.core.idle``), passed in.

Settings (all optional)::

    [sweep]
    interval_s = 300              # a sweep every 5 minutes inside ``gpubot serve``
    budget_s = 240                # a sweep never takes longer (default: 80 % of the interval)
    orphan_threshold_mib = 1024   # memory in use with no process above this is orphaned
    idle_min_mib = 4096           # idle holders: a process holding at least this much ...
    idle_hours = 4                # ... of a GPU at 0 % in every sample this long (0: off)
    keep_samples = "14d"          # utilisation samples are kept this long

    [alerts]
    channel = "C0123"             # default: [slack] channel
    reminder_s = 21600            # remind of a finding that persists, every 6 h

    [metrics]
    port = 9400                   # or ``gpubot serve --metrics-port``
    host = "127.0.0.1"
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from gpubot.core.idle import (
    DEFAULT_KEEP_S,
    MAX_GAP_INTERVALS,
    IdleRule,
    holder_owner,
    idle_summary,
    is_idle_holder,
    parse_duration,
)
from gpubot.core.models import FindingKind, GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.policy import SLACK_CHANNEL
from gpubot.core.protect import Protection, is_protected
from gpubot.core.workload import WorkloadKind
from gpubot.errors import ConfigError, GpubotError, ParseError, ProbeError

CONFIRM_SWEEPS = 2  # a finding alerts only once this many sweeps in a row saw it
SNOOZES: dict[str, float] = {"1h": 3600.0, "1d": 86400.0}
NODE_KINDS = frozenset({FindingKind.NODE_UNREACHABLE, FindingKind.SMI_FAILED})
GONE = "gone"  # holder suffix of a process nvidia-smi lists but /proc does not know

TITLES: dict[FindingKind, str] = {
    FindingKind.ORPHANED_VRAM: "orphaned GPU memory",
    FindingKind.ZOMBIE_PROCESS: "zombie process",
    FindingKind.HIDDEN_HOLDER: "hidden GPU holder",
    FindingKind.IDLE_HOLDER: "idle GPU holder",
    FindingKind.NODE_UNREACHABLE: "node unreachable",
    FindingKind.SMI_FAILED: "nvidia-smi failed",
    FindingKind.GPU_LOST: "GPU lost",
}


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    """The ``[sweep]``, ``[alerts]`` and ``[metrics]`` settings, validated."""

    interval_s: float = 300.0
    budget_s: float = 240.0
    orphan_threshold_mib: int = 1024
    idle: IdleRule = field(default_factory=IdleRule)
    reminder_s: float = 21600.0
    channel: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    @property
    def max_gap_s(self) -> float:
        """Return the longest gap between two samples that keeps a GPU's idle run going."""
        return MAX_GAP_INTERVALS * self.interval_s


SWEEP_KEYS = {"interval_s", "budget_s", "orphan_threshold_mib", "idle_min_mib", "idle_hours",
              "keep_samples"}  # fmt: skip


def load_sweep_config(extra: Mapping[str, Any], where: str = "<settings>") -> SweepConfig:
    """Validate the raw ``[sweep]``, ``[alerts]`` and ``[metrics]`` tables of the settings."""
    sweep = _table(where, "sweep", extra.get("sweep", {}))
    if "idle_holder" in sweep:
        raise ConfigError(
            f"{where}: sweep.idle_holder: replaced by sweep.idle_min_mib, sweep.idle_hours "
            '(0: off) and sweep.keep_samples (e.g. "14d"); remove the [sweep.idle_holder] table'
        )
    _keys(where, "sweep", sweep, SWEEP_KEYS)
    interval = _number(where, "sweep.interval_s", sweep.get("interval_s", 300.0))
    budget = _number(where, "sweep.budget_s", sweep.get("budget_s", round(interval * 0.8, 3)))
    if budget > interval:
        raise ConfigError(
            f"{where}: sweep.budget_s: {budget:g} is longer than sweep.interval_s ({interval:g})"
        )
    orphan = _number(
        where,
        "sweep.orphan_threshold_mib",
        sweep.get("orphan_threshold_mib", 1024),
        integer=True,
        zero=True,
    )
    idle = _idle_rule(where, sweep)

    alerts = _table(where, "alerts", extra.get("alerts", {}))
    _keys(where, "alerts", alerts, {"channel", "reminder_s"})
    reminder = _number(where, "alerts.reminder_s", alerts.get("reminder_s", 21600.0))
    slack = extra.get("slack", {})
    channel = alerts.get("channel", slack.get("channel") if isinstance(slack, Mapping) else None)
    if channel is not None and (
        not isinstance(channel, str) or not SLACK_CHANNEL.fullmatch(channel)
    ):
        raise ConfigError(f"{where}: alerts.channel: expected a channel id (C…), got {channel!r}")

    metrics = _table(where, "metrics", extra.get("metrics", {}))
    _keys(where, "metrics", metrics, {"port", "host"})
    port = metrics.get("port")
    if port is not None:
        port = check_port(port, f"{where}: metrics.port")
    host = metrics.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}: metrics.host: expected an address, got {host!r}")
    return SweepConfig(interval, budget, int(orphan), idle, reminder, channel, port, host)


def _idle_rule(where: str, sweep: Mapping[str, Any]) -> IdleRule:
    min_mib = _number(where, "sweep.idle_min_mib", sweep.get("idle_min_mib", IdleRule.min_mib),
                      integer=True)  # fmt: skip
    hours = _number(where, "sweep.idle_hours", sweep.get("idle_hours", IdleRule.hours), zero=True)
    keep_raw = sweep.get("keep_samples", None)
    keep = DEFAULT_KEEP_S
    if keep_raw is not None:
        try:
            keep = parse_duration(keep_raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: sweep.keep_samples: {exc}") from None
    rule = IdleRule(int(min_mib), hours, keep)
    if rule.enabled and keep < rule.window_s:
        raise ConfigError(
            f"{where}: sweep.keep_samples: {keep_raw} is shorter than sweep.idle_hours "
            f"({hours:g} h): no GPU could ever be seen idle that long"
        )
    return rule


def check_port(value: Any, what: str) -> int:
    """Return ``value`` as a TCP port number or raise ``ConfigError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{what}: {value!r} is not a port number (0-65535, 0: any free port)")
    return value


def _table(where: str, key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key}: expected a table")
    return value


def _keys(where: str, section: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(f"{where}: {section}.{k}: unknown key")


def _number(
    where: str, key: str, value: Any, *, integer: bool = False, zero: bool = False
) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value < 0 or (value == 0 and not zero):
        kind = "a whole number" if integer else "a number"
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{where}: {key}: expected {kind} {bound}, got {value!r}")
    return float(value)


# --- findings ----------------------------------------------------------------------------------


class Key(NamedTuple):
    """The stable identity of a finding: node, GPU, kind, holder ("pid:start_ticks" or "")."""

    node: str
    gpu: int | None
    kind: str
    holder: str


@dataclass(frozen=True)
class Finding:
    """One piece of trouble a sweep found."""

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
    idle_s: float | None = None  # an idle holder: how long its GPU has been held idle so far

    @property
    def key(self) -> Key:
        """Return the finding's stable key."""
        return Key(self.node, self.gpu, self.kind.value, self.holder)

    @property
    def title(self) -> str:
        """Return the kind as words."""
        return TITLES[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready form."""
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
        }


@dataclass(frozen=True)
class NodeFailure:
    """A node that gave no usable answer, and why."""

    kind: FindingKind  # NODE_UNREACHABLE or SMI_FAILED
    reason: str


def classify_failure(exc: GpubotError) -> FindingKind:
    """Return the finding kind of a node's failure: nvidia-smi's own, or the node's."""
    if isinstance(exc, ProbeError | ParseError):
        return FindingKind.SMI_FAILED
    return FindingKind.NODE_UNREACHABLE


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
) -> tuple[Finding, ...]:
    """Return every finding of one sweep, in node then GPU order.

    ``idle``: ``{(node, gpu): seconds held idle}`` of the GPUs idle for the idle window
    (``core.idle.idle_gpus``); their holders of enough memory are idle holders.
    """
    out: list[Finding] = []
    for snap in snapshots:
        for g in sorted(snap.gpus, key=lambda g: g.index):
            procs = snap.on_gpu(g.index)
            rule = protection or Protection()
            idle_s = (idle or {}).get((snap.node, g.index))
            out.extend(_gpu_findings(snap.node, g, procs, config, rule, idle_s,
                                     hidepid=bool(snap.hidepid)))  # fmt: skip
        for bus in snap.lost:  # its index was not said: the node's finding, keyed by bus id
            out.append(Finding(snap.node, None, FindingKind.GPU_LOST, bus,
                               f"a GPU ({bus}) is lost: it needs a reset or a reboot"))  # fmt: skip
    for node, f in failures.items():
        out.append(Finding(node, None, f.kind, "", f.reason))
    return tuple(out)


def _gpu_findings(
    node: str,
    g: GpuInfo,
    procs: Sequence[GpuProcess],
    config: SweepConfig,
    protection: Protection,
    idle_s: float | None,
    *,
    hidepid: bool = False,
) -> list[Finding]:
    out: list[Finding] = []
    if "lost" in g.flags:  # fell off the bus: nothing else about it can be known
        why = f" ({g.bus_id})" if g.bus_id else ""
        return [Finding(node, g.index, FindingKind.GPU_LOST, "",
                        f"GPU {g.index}{why} is lost: it needs a reset or a reboot")]  # fmt: skip
    holders = [p for p in procs if not is_protected(p, protection)]
    used = g.memory_used_mib
    if not holders and used is not None and used > config.orphan_threshold_mib:
        unseen = " (holders of its device file cannot be seen)" if g.minor is None else ""
        out.append(
            Finding(
                node,
                g.index,
                FindingKind.ORPHANED_VRAM,
                "",
                f"{used} MiB in use and no process holds the GPU{unseen}",
                memory_mib=used,
            )
        )
    for p in holders:
        if hidepid and not p.exists:  # "gone" may only be hidden: no zombie on that evidence
            continue
        kind_summary = _process_trouble(p, g, config, idle_s)
        if kind_summary is not None:
            kind, summary = kind_summary
            out.append(
                Finding(
                    node,
                    g.index,
                    kind,
                    holder_id(p),
                    summary,
                    pid=p.pid,
                    user=p.user,
                    memory_mib=p.used_memory_mib,
                    owner=holder_owner(p),
                    workload=workload_label(p),
                    idle_s=idle_s if kind is FindingKind.IDLE_HOLDER else None,
                )
            )
    return out


def workload_label(p: GpuProcess) -> str | None:
    """Return the short label of a process's workload, if it names one (``docker:train``)."""
    w = p.workload
    return None if w is None or w.kind is WorkloadKind.OTHER else w.short


def _process_trouble(
    p: GpuProcess, g: GpuInfo, config: SweepConfig, idle_s: float | None
) -> tuple[FindingKind, str] | None:
    """Return the kind and summary of what is wrong with one holder, or None."""
    who = f"pid {p.pid} {p.process_name}" + (f" ({p.user})" if p.user else "")
    mem = "" if p.used_memory_mib is None else f", {p.used_memory_mib} MiB"
    if p.state == "Z":
        return FindingKind.ZOMBIE_PROCESS, f"{who} is a zombie (state Z){mem}"
    if p.state == "D":
        where = f" in {p.wchan}" if p.wchan else ""
        return FindingKind.ZOMBIE_PROCESS, f"{who} is stuck in the kernel (state D{where}){mem}"
    if p.visible_to_nvidia_smi and not p.exists:
        return FindingKind.ZOMBIE_PROCESS, f"{who} is listed by nvidia-smi but gone from /proc{mem}"
    if p.hidden and p.exists:
        label = workload_label(p)
        seen = f" in {label}" if label else ""
        return (
            FindingKind.HIDDEN_HOLDER,
            f"{who} holds the device file{seen} but nvidia-smi does not list it",
        )
    if idle_s is not None and config.idle.enabled and is_idle_holder(p, config.idle):
        return FindingKind.IDLE_HOLDER, idle_summary(p, g, duration_text(idle_s))
    return None


# --- alert decisions -------------------------------------------------------------------------


class AlertState(Protocol):
    """What the decisions read of a finding's stored alert state (``gpubot.store.Alert``)."""

    @property
    def first_seen(self) -> datetime: ...
    @property
    def seen_count(self) -> int: ...
    @property
    def alerted_at(self) -> datetime | None: ...
    @property
    def reminded_at(self) -> datetime | None: ...
    @property
    def snoozed_until(self) -> datetime | None: ...
    @property
    def resolved_at(self) -> datetime | None: ...


class Notice(StrEnum):
    """What to say about a finding after a sweep."""

    NONE = "none"
    ALERT = "alert"
    REMIND = "remind"


def confirmed(kind: str, state: AlertState, now: datetime, config: SweepConfig) -> bool:
    """Whether a finding is real: seen in consecutive sweeps.

    An idle holder is found only once its GPU's samples span the idle window; it is confirmed
    like any other, so a process that has just started on a GPU held idle gets one interval.
    """
    return state.resolved_at is None and state.seen_count >= CONFIRM_SWEEPS


def snoozed(state: AlertState, now: datetime) -> bool:
    """Whether alerts for the finding are snoozed at ``now``."""
    return state.snoozed_until is not None and now < state.snoozed_until


def notice(kind: str, state: AlertState, now: datetime, config: SweepConfig) -> Notice:
    """Decide whether a finding seen by this sweep alerts, reminds, or stays quiet."""
    if not confirmed(kind, state, now, config) or snoozed(state, now):
        return Notice.NONE
    if state.alerted_at is None:
        return Notice.ALERT
    last = max(state.alerted_at, state.reminded_at or state.alerted_at)
    due = last + timedelta(seconds=config.reminder_s)
    if state.snoozed_until is not None and state.snoozed_until > last:
        due = min(due, state.snoozed_until)  # a snooze that ended since: remind at its end
    return Notice.REMIND if now >= due else Notice.NONE


def to_resolve(
    open_keys: Iterable[Key],
    found: Collection[Key],
    *,
    answered: Collection[str],
    failed: Collection[str],
    configured: Collection[str],
) -> list[Key]:
    """Return the open findings that cleared: not found again where the sweep could see.

    A GPU finding of a node that did not answer stays open (nobody looked); a node finding
    clears once the node answers or fails in another way; a node no longer configured clears.
    """
    out: list[Key] = []
    for key in open_keys:
        if key in found:
            continue
        gone = key.node not in configured
        looked = key.node in answered or (key.kind in NODE_KINDS and key.node in failed)
        if gone or looked:
            out.append(key)
    return out


def snooze_until(now: datetime, choice: str) -> datetime:
    """Return when a snooze chosen as ``1h`` or ``1d`` ends; raise ``ValueError`` otherwise."""
    if choice not in SNOOZES:
        raise ValueError(f"unknown snooze {choice!r} (one of {', '.join(SNOOZES)})")
    return now + timedelta(seconds=SNOOZES[choice])


def duration_text(seconds: float) -> str:
    """Return a duration for people: ``45 s``, ``14 min``, ``2 h 5 min``, ``3 d 4 h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


# --- reset readiness of an orphaned GPU --------------------------------------------------------

# One exec: topology, MIG and persistence mode of the GPUs, the persistence daemon. Everything
# that varies arrives as a positional argument; sections are opened by "@gpubot <kind> <status>".
# No output holds text a process controls (ps prints PIDs only), so a fixed marker is enough.
READY_SCRIPT = """m() { printf '\\n@gpubot %s\\n' "$*"; }
smi=$1 T=$2 idx=$3
o=$(timeout -k 1 "$T" "$smi" topo -m 2>&1); s=$?
m topo "$s"; printf '%s\\n' "$o"
o=$(timeout -k 1 "$T" "$smi" --query-gpu=index,mig.mode.current,persistence_mode \\
    --format=csv,noheader -i "$idx" 2>&1); s=$?
m modes "$s"; printf '%s\\n' "$o"
o=$(ps -C nvidia-persistenced -o pid= 2>&1); s=$?
m persistenced "$s"; printf '%s\\n' "$o"
m end
"""


def ready_argv(nvidia_smi: str, gpus: Sequence[int], timeout_s: float) -> list[str]:
    """Return the argv that gathers the reset readiness of ``gpus`` (parse with ``readiness``)."""
    if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
        raise ValueError(f"GPU indices must be whole numbers >= 0, got {list(gpus)!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return [
        "sh",
        "-c",
        READY_SCRIPT,
        "gpubot-ready",
        nvidia_smi,
        f"{timeout_s:g}",
        ",".join(str(g) for g in gpus),
    ]


@dataclass(frozen=True)
class Readiness:
    """What a person should know before ``nvidia-smi --gpu-reset`` of one GPU."""

    gpu: int
    processes: tuple[str, ...]  # what still holds the GPU (daemons included)
    persistence_daemon: str  # "running (pid N)", "not running", "unknown"
    nvlink_peers: tuple[int, ...] | None  # None: unknown
    nvlink_note: str  # why unknown
    mig_mode: str | None  # "Enabled", "Disabled", "not supported", None: unknown
    persistence_mode: str | None

    def lines(self) -> list[str]:
        """Return the readiness list, one line per item."""
        procs = ", ".join(self.processes) if self.processes else "none"
        if self.nvlink_peers is None:
            peers = f"unknown ({self.nvlink_note})" if self.nvlink_note else "unknown"
        elif self.nvlink_peers:
            peers = "GPU " + ", ".join(str(g) for g in self.nvlink_peers) + " (may reset too)"
        else:
            peers = "none"
        pm = f" (persistence mode {self.persistence_mode})" if self.persistence_mode else ""
        return [
            f"processes on GPU {self.gpu}: {procs}",
            f"persistence daemon: {self.persistence_daemon}{pm}",
            f"NVLink peers: {peers}",
            f"MIG mode: {self.mig_mode or 'unknown'}",
        ]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready form."""
        return {
            "gpu": self.gpu,
            "processes": list(self.processes),
            "persistence_daemon": self.persistence_daemon,
            "nvlink_peers": None if self.nvlink_peers is None else list(self.nvlink_peers),
            "nvlink_note": self.nvlink_note,
            "mig_mode": self.mig_mode,
            "persistence_mode": self.persistence_mode,
        }


def readiness(
    snap: NodeSnapshot | None,
    gpus: Sequence[int],
    output: str | None,
    *,
    why_unknown: str = "",
) -> dict[int, Readiness]:
    """Build the readiness of ``gpus`` from the snapshot and the ``ready_argv`` output.

    ``output`` None (the command could not run) leaves what only the node can say unknown.
    """
    sections = _ready_sections(output or "") if output is not None else {}
    topo_status, topo = sections.get("topo", (None, ""))
    peers: dict[int, tuple[int, ...]] | None = None
    note = why_unknown or "not asked"
    if topo_status == 0:
        peers = parse_topo_peers(topo)
        note = "" if peers is not None else "nvidia-smi topo -m gave no GPU matrix"
    elif topo_status is not None:
        note = "nvidia-smi topo -m is not available here"
    modes_status, modes_text = sections.get("modes", (None, ""))
    modes = parse_modes(modes_text) if modes_status == 0 else {}
    pd_status, pd_text = sections.get("persistenced", (None, ""))
    if pd_status == 0:
        pids = [w for w in pd_text.split() if w.isdigit()]
        daemon = f"running (pid {', '.join(pids)})" if pids else "running"
    elif pd_status == 1:
        daemon = "not running"
    else:
        daemon = "unknown"
    out: dict[int, Readiness] = {}
    for g in gpus:
        procs = tuple(
            f"{p.process_name} (pid {p.pid}, {p.user or '?'})"
            for p in (snap.on_gpu(g) if snap is not None else ())
        )
        mig, pm = modes.get(g, (None, None))
        gpu_peers = None if peers is None else peers.get(g, ())
        out[g] = Readiness(g, procs, daemon, gpu_peers, note if gpu_peers is None else "", mig, pm)
    return out


def _ready_sections(text: str) -> dict[str, tuple[int | None, str]]:
    marker = re.compile("\n@gpubot ([^\n]*)\n")
    text = "\n" + text
    found = list(marker.finditer(text))
    out: dict[str, tuple[int | None, str]] = {}
    for m, nxt in zip(found, [*found[1:], None][: len(found)], strict=True):
        words = m[1].split(" ")
        body = text[m.end() : nxt.start() if nxt else len(text)]
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        out.setdefault(words[0], (status, body))
    return out


_GPU_COL = re.compile(r"GPU(\d+)")


def parse_topo_peers(text: str) -> dict[int, tuple[int, ...]] | None:
    """Return each GPU's NVLink peers from ``nvidia-smi topo -m`` (None: no matrix found)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header: list[str] | None = None
    out: dict[int, tuple[int, ...]] = {}
    for line in lines:
        words = line.split()
        if header is None:
            # The header names the columns; every row has an "X" where a GPU meets itself.
            if words and _GPU_COL.fullmatch(words[0]) and "X" not in words:
                header = []
                for w in words:  # device columns end where "CPU Affinity" begins
                    if w in ("CPU", "NUMA", "GPU") or w.startswith(("CPU", "NUMA")):
                        break
                    header.append(w)
            continue
        if not words or words[0] == "Legend:":
            break
        row = _GPU_COL.fullmatch(words[0])
        if row is None:
            continue
        cells = words[1 : 1 + len(header)]
        peers = []
        for name, cell in zip(header, cells, strict=False):
            col = _GPU_COL.fullmatch(name)
            if col and re.fullmatch(r"NV\d+", cell) and col[1] != row[1]:
                peers.append(int(col[1]))
        out[int(row[1])] = tuple(peers)
    return out if header is not None and out else None


def parse_modes(text: str) -> dict[int, tuple[str | None, str | None]]:
    """Return ``{gpu: (MIG mode, persistence mode)}`` from the readiness query's CSV rows."""
    out: dict[int, tuple[str | None, str | None]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        mig = "not supported" if parts[1] in ("[N/A]", "N/A", "[Not Supported]") else parts[1]
        pm = None if parts[2] in ("[N/A]", "N/A", "[Not Supported]") else parts[2]
        out[int(parts[0])] = (mig or None, pm or None)
    return out
