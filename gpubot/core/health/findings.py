"""GPU health findings: what each health state means, and the next step.

Pure (time and what earlier sweeps saw are passed in). Each finding's
summary ends with its next step, in the order NVIDIA's recovery chain has them (reset the GPU
when idle → drain and reboot → hardware: open a ticket):

- a pending row remap (or retired page) is applied by a GPU reset: gpubot's guarded
  ``gpu-reset`` when the GPU is idle; when processes hold it, they must stop first (the alert's
  Reset button, through approval where they are other people's);
- a failed row remap is hardware: open a ticket;
- a non-zero VOLATILE uncorrectable ECC count is a finding from the first reading on, while it
  stays non-zero (an error since the driver loaded: jobs on the GPU may fail until a GPU reset
  clears it; NVIDIA/k8s-device-plugin#267); the lifetime (aggregate) count is only a baseline;
- an uncorrectable ECC count that grew since the previous sweep is a second finding, standing
  for ``ECC_HOLD`` sweeps after it last grew;
- a GPU whose NVSwitch fabric registration has not completed with success is flagged (its reset
  may need the fabric manager running); so is one whose NVLink links that should be up are not,
  all of them included (``core.health.nvlink``: a link never seen up outside a fabric is taken
  as not wired, so an H100 PCIe pair's 6 unwired links each are no fault);
- throttling (HW slowdown, HW or SW thermal slowdown) is a finding only when the previous sweep
  saw it too: a moment is not.

``[N/A]`` and ``[Not Supported]`` fields are None in ``health.state``: nothing here alerts on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gpubot.core.findings import Finding, FindingKind
from gpubot.core.health.hung import HungMemory, HungRule, find_hung
from gpubot.core.health.nvlink import LinkKey, expect_links, learn_links
from gpubot.core.health.state import REASON_WORDS, GpuHealth, NodeHealth
from gpubot.core.models import GpuInfo, NodeSnapshot

# A GPU reset applies a pending repair, or may bring the fabric or links back: the alert offers it.
MEMORY_REPAIR_PENDING = FindingKind(
    "memory-repair-pending", "GPU memory repair pending", reset=True, gpu_reset=True
)
# On a node a scheduler owns, a GPU whose memory cannot be repaired or whose uncorrectable errors
# grow offers to drain the node (their own advice: drain it), and so does one whose fabric is not
# ready (CUDA jobs across GPUs fail on it until a reset brings it back).
REMAP_FAILED = FindingKind("remap-failed", "GPU row remapping failed", drain=True)
ECC_UNCORRECTED = FindingKind("ecc-uncorrected", "uncorrectable ECC errors growing", drain=True)
ECC_SINCE_LOAD = FindingKind(
    "ecc-since-load", "uncorrectable ECC errors since the driver loaded", reset=True, gpu_reset=True
)
FABRIC_NOT_READY = FindingKind(
    "fabric-not-ready", "GPU fabric not ready", reset=True, gpu_reset=True, drain=True
)
NVLINK_DOWN = FindingKind("nvlink-down", "NVLink link down", reset=True, gpu_reset=True)
GPU_THROTTLED = FindingKind("gpu-throttled", "GPU throttled")

ECC_HOLD = 3  # sweeps an ECC finding stands after the count last grew
EccKey = tuple[str, str, str]  # (node, GPU uuid, "volatile" | "aggregate")


@dataclass(frozen=True)
class EccSeen:
    """An uncorrectable ECC count as earlier sweeps saw it."""

    count: int
    grew_from: int | None = None  # the count before it last grew (None: it has not)
    sweeps_since: int = 0  # sweeps since it last grew


@dataclass
class HealthMemory:
    """What earlier sweeps saw: ECC counts, each GPU's throttle reasons last sweep, and the
    NVLink links each GPU has been seen with up, and the hung-but-busy runs and learned busy
    draws (``core.health.hung``)."""

    ecc: dict[EccKey, EccSeen] = field(default_factory=dict)
    throttled: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    links: dict[LinkKey, tuple[int, ...]] = field(default_factory=dict)
    hung: HungMemory = field(default_factory=HungMemory)


def find_health(
    snapshots: Iterable[NodeSnapshot],
    health: Mapping[str, NodeHealth],
    memory: HealthMemory,
    *,
    hung: HungRule | None = None,
    at: float | None = None,
) -> tuple[tuple[Finding, ...], HealthMemory]:
    """Return the health findings of one sweep and what the next sweep must remember
    (``hung``: the hung-but-busy rule, None: not looked for; ``at``: the sweep's time)."""
    snapshots = list(snapshots)
    out: list[Finding] = []
    new = HealthMemory(dict(memory.ecc), {}, dict(memory.links))
    for snap in snapshots:
        node_health = health.get(snap.node)
        if node_health is None:
            continue
        node_health = expect_links(snap.node, snap.gpus, node_health, memory.links)
        new.links = learn_links(snap.node, snap.gpus, node_health, new.links)
        for g in sorted(snap.gpus, key=lambda g: g.index):
            h = node_health.gpus.get(g.index)
            if h is None or "lost" in g.flags:
                continue
            busy = len([p for p in snap.on_gpu(g.index) if p.exists and not p.system])
            found = (
                *_memory(snap.node, g, h, busy),
                *_ecc_since_load(snap.node, g, h, busy),
                *_ecc(snap.node, g, h, memory, new),
                *_fabric(snap.node, g, h, node_health, busy),
                *_throttle(snap.node, g, h, memory, new),
            )
            out += [Finding(snap.node, g.index, k, "", said, drain=d) for k, said, d in found]
    if hung is not None:
        stuck, new.hung = find_hung(snapshots, health, memory.hung, hung, at=at)
        out += stuck
    return tuple(out), new


def reset_step(node: str, gpu: int, busy: int) -> str:
    """Return the next step when a GPU reset is what helps."""
    if busy:
        return (
            f"{busy} process(es) hold it: stop them first (the Reset button, through approval "
            f"where they are others'), then gpu-reset {node} gpu {gpu}"
        )
    return f"it is idle: gpu-reset {node} gpu {gpu} now"


class Said(NamedTuple):
    """A GPU's finding as a producer says it; ``drain``: offer to drain the node though its kind
    does not (a board's own slowdown, beside a thermal one)."""

    kind: FindingKind
    summary: str
    drain: bool = False


Found = Iterator[Said]


def _memory(node: str, g: GpuInfo, h: GpuHealth, busy: int) -> Found:
    if h.remap_failure:
        text = (
            f"GPU {g.index} ({g.name}): a row remapping failed: its memory cannot be "
            "repaired. Hardware: drain it and open a ticket"
        )
        yield Said(REMAP_FAILED, text)
    if h.remap_pending or h.retired_pending:
        what = "a remapped row" if h.remap_pending else "a retired page"
        step = reset_step(node, g.index, busy)
        text = f"GPU {g.index}: {what} waits for a GPU reset to take effect; {step}"
        yield Said(MEMORY_REPAIR_PENDING, text)


def _ecc_since_load(node: str, g: GpuInfo, h: GpuHealth, busy: int) -> Found:
    """A volatile uncorrectable count above 0 means an error since the driver loaded: a finding
    at the first reading (it needs no history), standing until a reset or reload clears it."""
    if not h.ecc_volatile:
        return
    n = h.ecc_volatile
    life = f" (aggregate {h.ecc_aggregate})" if h.ecc_aggregate is not None else ""
    text = (
        f"GPU {g.index}: {n} uncorrectable ECC error{'s' if n != 1 else ''} since the driver "
        f"loaded{life}: jobs on it may fail ('uncorrectable ECC error encountered'); "
        f"{reset_step(node, g.index, busy)}; if it comes back after the reset, hardware: open "
        "a ticket"
    )
    yield Said(ECC_SINCE_LOAD, text)


def _ecc(node: str, g: GpuInfo, h: GpuHealth, memory: HealthMemory, new: HealthMemory) -> Found:
    grew: list[str] = []
    for which, count in (("volatile", h.ecc_volatile), ("aggregate", h.ecc_aggregate)):
        key = (node, g.uuid, which)
        if count is None:
            continue
        before = memory.ecc.get(key)
        if before is None or count < before.count:  # first seen, or reset (volatile): baseline
            new.ecc[key] = EccSeen(count)
            continue
        if count > before.count:
            seen = EccSeen(count, before.count, 0)
        elif before.grew_from is not None and before.sweeps_since + 1 < ECC_HOLD:
            seen = EccSeen(count, before.grew_from, before.sweeps_since + 1)
        else:
            seen = EccSeen(count)
        new.ecc[key] = seen
        if seen.grew_from is not None:
            grew.append(f"{which} {seen.grew_from} → {seen.count}")
    if grew:
        text = (
            f"GPU {g.index}: uncorrectable ECC errors grew ({', '.join(grew)}): drain it; a "
            "pending remap is applied by a GPU reset, and if the count keeps growing, hardware: "
            "open a ticket"
        )
        yield Said(ECC_UNCORRECTED, text)


def _fabric(node: str, g: GpuInfo, h: GpuHealth, nh: NodeHealth, busy: int) -> Found:
    fm = f"; fabric manager: {nh.fabric_manager}"
    start = "start nvidia-fabricmanager, then " if nh.fabric_manager.startswith("not") else ""
    step = start + reset_step(node, g.index, busy)
    if h.fabric_ready is False:
        status = f", status {h.fabric_status}" if h.fabric_status else ""
        text = (
            f"GPU {g.index}: NVSwitch fabric state {h.fabric_state}{status}{fm}: CUDA jobs "
            f"across GPUs fail until it completes; {step}"
        )
        yield Said(FABRIC_NOT_READY, text)
    links = h.links
    if links is not None and links.missing and links.expected is not None:
        down = ", ".join(str(i) for i in links.missing)
        total = len(links.expected)
        what = (
            f"all {total} NVLink links inactive"
            + (" (NVML: all links are inactive)" if links.all_inactive else f" (link {down})")
            if not links.up
            else f"{len(links.missing)} of {total} NVLink links inactive (link {down})"
        )
        text = (
            f"GPU {g.index}: {what}; {step}; if they stay down after a reset, drain and reboot, "
            "then hardware: open a ticket"
        )
        yield Said(NVLINK_DOWN, text)


def _throttle(
    node: str, g: GpuInfo, h: GpuHealth, memory: HealthMemory, new: HealthMemory
) -> Found:
    if not h.slowdown:
        return
    new.throttled[(node, g.uuid)] = h.slowdown
    if not memory.throttled.get((node, g.uuid)):  # a moment is not a finding
        return
    words = ", ".join(REASON_WORDS[r] for r in h.slowdown)
    temp = f" at {h.temperature_c} C" if h.temperature_c is not None else ""
    power = f", {h.power_w:g} W" if h.power_w is not None else ""
    thermal = any("thermal" in r for r in h.slowdown)
    step = (
        "check the box's cooling (fans, airflow, inlet temperature)"
        if thermal
        else "HW slowdown is the board's own (power brake, power supply): drain it and, if it "
        "persists, hardware: open a ticket"
    )
    text = f"GPU {g.index}: {words} for two sweeps or more{temp}{power}: {step}"
    yield Said(GPU_THROTTLED, text, drain=not thermal)  # the board's own: drain it
