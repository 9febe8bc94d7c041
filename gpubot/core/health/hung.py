"""Hung-but-busy holders: a job the GPU says is busy, but which draws little and does nothing.

Pure (each look's time and what earlier sweeps saw are passed in). A wedged collective (an NCCL
hang) spins the GPU at 100 % utilisation while its power stays near idle and its memory never
moves (nebius/soperator#796, marin-community/marin#7344, nvitop#189). A holder is *hung-busy*
after ``HungRule.sweeps`` looks in a row, within the sweep's gap, at each of which:

- its GPU says at least ``busy_pct`` % utilisation;
- its GPU draws less than ``low_fraction`` of the typical busy draw of its model: the median of
  the last ``learn_keep`` readings of GPUs of that model (same name) at ``learn_pct`` % or more,
  once ``learn_min`` are known; until then less than ``limit_fraction`` of the GPU's power limit
  (no limit said, no reading learned: never judged, unknown is not hung). A reading under the
  line of its moment is not learned: wedged GPUs (512 at once in marin#7344) would otherwise
  teach that a wedged draw is typical, and after ``learn_min`` looks stop being found;
- its own memory (nvidia-smi's compute apps) is within ``flat_mib`` of what it held at the run's
  first look (a job loading data grows; any move starts the run again).

Judged per process holder (pid + start ticks), never per GPU: a job that comes to a wedged GPU
has a run of its own, from its first look, so it is never accused on another's time. Never an
action: a finding for the owner, with the evidence (utilisation, power against the typical draw,
memory, since when).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpubot.core import durations
from gpubot.core.findings import Finding, FindingKind, process_finding
from gpubot.core.health.state import NodeHealth
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.holder_runs import holder_key
from gpubot.core.usage.report import utc_minute

HUNG_BUSY = FindingKind("hung-busy", "GPU busy without progress", ladder=True)

RunKey = tuple[str, int, str]  # (node, GPU index, "pid:start_ticks")


@dataclass(frozen=True)
class HungRule:
    """When a busy holder counts as hung (``sweeps`` 0: never)."""

    sweeps: int = 3
    max_gap_s: float = 450.0  # a longer gap between two looks starts a run again
    busy_pct: int = 95
    low_fraction: float = 0.5  # of the model's learned typical busy draw
    limit_fraction: float = 0.35  # of the power limit, until the model's draw is learned
    learn_pct: int = 90
    learn_min: int = 20
    learn_keep: int = 200
    flat_mib: int = 64

    @property
    def enabled(self) -> bool:
        return self.sweeps > 0


@dataclass(frozen=True)
class HungRun:
    """One holder's run of hung-looking looks: since when, how many, what it held."""

    since: float
    last_at: float
    looks: int
    mib: int  # what it held at the run's first look
    util_min: int
    power_max: float


@dataclass
class HungMemory:
    """What earlier sweeps saw: each holder's run, and busy draws per GPU model (newest last)."""

    runs: dict[RunKey, HungRun] = field(default_factory=dict)
    draws: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class LowLine:
    """Below what power a busy GPU of a model draws far too little, and why that line."""

    watts: float
    why: str  # "median of 40 busy readings of H100: 640 W" / "0.35 × the 700 W limit"


def low_line(
    model: str, limit_w: float | None, memory: HungMemory, rule: HungRule
) -> LowLine | None:
    """Return the low-power line of a GPU of ``model`` (None: nothing to judge by)."""
    seen = memory.draws.get(model, ())
    if len(seen) >= rule.learn_min:
        typical = statistics.median(seen)
        why = f"{rule.low_fraction:g} × the median {typical:.0f} W of {len(seen)} busy readings"
        return LowLine(rule.low_fraction * typical, why)
    if limit_w:
        return LowLine(
            rule.limit_fraction * limit_w, f"{rule.limit_fraction:g} × its {limit_w:.0f} W limit"
        )
    return None


def find_hung(
    snapshots: Iterable[NodeSnapshot],
    health: Mapping[str, NodeHealth],
    memory: HungMemory,
    rule: HungRule,
    *,
    at: float | None = None,
) -> tuple[tuple[Finding, ...], HungMemory]:
    """Return one sweep's hung-busy findings and what the next sweep must remember. Each look is
    at the sweep's time ``at`` (None: its snapshot's); a node that did not answer keeps its runs
    until the gap ends them."""
    if not rule.enabled:
        return (), HungMemory()
    new = HungMemory({}, dict(memory.draws))
    out: list[Finding] = []
    answered = set()
    for snap in snapshots:
        answered.add(snap.node)
        nh = health.get(snap.node)
        if nh is None:
            continue
        for g in sorted(snap.gpus, key=lambda g: g.index):
            h = nh.gpus.get(g.index)
            util = g.utilization_pct
            if h is None or h.power_w is None or util is None or "lost" in g.flags:
                continue
            line = low_line(g.name, h.power_limit_w, memory, rule)  # learned in earlier sweeps
            if util >= rule.learn_pct and (line is None or h.power_w >= line.watts):
                new.draws[g.name] = (*new.draws.get(g.name, ()), h.power_w)[-rule.learn_keep :]
            if line is None or util < rule.busy_pct or h.power_w >= line.watts:
                continue
            for p in snap.on_gpu(g.index):
                key = holder_key(snap.node, p)
                if key is None or p.system or p.used_memory_mib is None:
                    continue
                old = memory.runs.get(key)
                when = snap.taken_at if at is None else at
                run = _advance(old, p.used_memory_mib, util, h.power_w, when, rule)
                new.runs[key] = run
                if run.looks >= rule.sweeps:
                    out.append(_finding(snap.node, g, p, run, line, h.power_w, util))
    for key, run in memory.runs.items():  # a silent node's runs wait for it, within the gap
        if key[0] not in answered and key not in new.runs:
            new.runs[key] = run
    return tuple(out), new


def _advance(
    old: HungRun | None, mib: int, util: int, watts: float, at: float, rule: HungRule
) -> HungRun:
    if old is not None and at <= old.last_at:  # an overlapping look adds nothing
        return old
    if old is None or at - old.last_at > rule.max_gap_s or abs(mib - old.mib) > rule.flat_mib:
        return HungRun(at, at, 1, mib, util, watts)
    return HungRun(
        old.since, at, old.looks + 1, old.mib, min(old.util_min, util), max(old.power_max, watts)
    )


def _finding(
    node: str, g: GpuInfo, p: GpuProcess, run: HungRun, line: LowLine, watts: float, util: int
) -> Finding:
    who = f"pid {p.pid} {p.process_name}" + (f" ({p.user})" if p.user else "")
    lasted = durations.format(run.last_at - run.since, "people")
    pct = f"{run.util_min}" if run.util_min == util else f"{run.util_min}-{util}"
    summary = (
        f"{who} on GPU {g.index} looks hung: {run.looks} looks in a row since "
        f"{utc_minute(run.since)} UTC ({lasted}) at {pct} % utilisation but at most "
        f"{run.power_max:.0f} W (now {watts:.0f} W; far below is under {line.watts:.0f} W: "
        f"{line.why}), its {p.used_memory_mib} MiB unchanged: a wedged job (an NCCL hang?). "
        "Its owner is asked to check it; a forced stop comes only after they were told"
    )
    return process_finding(node, g.index, HUNG_BUSY, p, summary)
