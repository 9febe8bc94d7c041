"""GPU health findings: what each health state means, and the next step.

Pure (time and what earlier sweeps saw are passed in). Each finding's
summary ends with its next step, in the order NVIDIA's recovery chain has them (reset the GPU
when idle → drain and reboot → hardware: open a ticket):

- a pending row remap (or retired page) is applied by a GPU reset: gpubot's guarded
  ``gpu-reset`` when the GPU is idle; when processes hold it, they must stop first (the alert's
  Reset button, through approval where they are other people's);
- a failed row remap is hardware: open a ticket;
- an uncorrectable ECC count that grew since the previous sweep (a count seen once is the
  baseline: a GPU's lifetime count is not news) stands for ``ECC_HOLD`` sweeps after it last grew;
- a GPU whose NVSwitch fabric registration has not completed with success, or whose NVLink
  links are partly down, is flagged (its reset may need the fabric manager running);
- throttling (HW slowdown, HW or SW thermal slowdown) is a finding only when the previous sweep
  saw it too: a moment is not.

``[N/A]`` and ``[Not Supported]`` fields are None in ``health.state``: nothing here alerts on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpubot.core.findings import Finding, FindingKind
from gpubot.core.health.state import REASON_WORDS, GpuHealth, NodeHealth
from gpubot.core.models import GpuInfo, NodeSnapshot

# A GPU reset applies a pending repair, or may bring the fabric or links back: the alert offers it.
MEMORY_REPAIR_PENDING = FindingKind(
    "memory-repair-pending", "GPU memory repair pending", reset=True, gpu_reset=True
)
REMAP_FAILED = FindingKind("remap-failed", "GPU row remapping failed")
ECC_UNCORRECTED = FindingKind("ecc-uncorrected", "uncorrectable ECC errors growing")
FABRIC_NOT_READY = FindingKind(
    "fabric-not-ready", "GPU fabric not ready", reset=True, gpu_reset=True
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
    """What earlier sweeps saw: ECC counts, and each GPU's throttle reasons last sweep."""

    ecc: dict[EccKey, EccSeen] = field(default_factory=dict)
    throttled: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def find_health(
    snapshots: Iterable[NodeSnapshot],
    health: Mapping[str, NodeHealth],
    memory: HealthMemory,
) -> tuple[tuple[Finding, ...], HealthMemory]:
    """Return the health findings of one sweep and what the next sweep must remember."""
    out: list[Finding] = []
    new = HealthMemory(dict(memory.ecc), {})
    for snap in snapshots:
        node_health = health.get(snap.node)
        if node_health is None:
            continue
        for g in sorted(snap.gpus, key=lambda g: g.index):
            h = node_health.gpus.get(g.index)
            if h is None or "lost" in g.flags:
                continue
            busy = [p for p in snap.on_gpu(g.index) if p.exists and not p.system]
            out += _memory(snap.node, g, h, len(busy))
            out += _ecc(snap.node, g, h, memory, new)
            out += _fabric(snap.node, g, h, node_health, len(busy))
            out += _throttle(snap.node, g, h, memory, new)
    return tuple(out), new


def reset_step(node: str, gpu: int, busy: int) -> str:
    """Return the next step when a GPU reset is what helps."""
    if busy:
        return (
            f"{busy} process(es) hold it: stop them first (the Reset button, through approval "
            f"where they are others'), then gpu-reset {node} gpu {gpu}"
        )
    return f"it is idle: gpu-reset {node} gpu {gpu} now"


def _memory(node: str, g: GpuInfo, h: GpuHealth, busy: int) -> list[Finding]:
    out: list[Finding] = []
    if h.remap_failure:
        out.append(
            Finding(
                node,
                g.index,
                REMAP_FAILED,
                "",
                f"GPU {g.index} ({g.name}): a row remapping failed: its memory cannot be "
                "repaired. Hardware: drain it and open a ticket",
            )
        )
    if h.remap_pending or h.retired_pending:
        what = "a remapped row" if h.remap_pending else "a retired page"
        out.append(
            Finding(
                node,
                g.index,
                MEMORY_REPAIR_PENDING,
                "",
                f"GPU {g.index}: {what} waits for a GPU reset to take effect; "
                + reset_step(node, g.index, busy),
            )
        )
    return out


def _ecc(
    node: str, g: GpuInfo, h: GpuHealth, memory: HealthMemory, new: HealthMemory
) -> list[Finding]:
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
    if not grew:
        return []
    return [
        Finding(
            node,
            g.index,
            ECC_UNCORRECTED,
            "",
            f"GPU {g.index}: uncorrectable ECC errors grew ({', '.join(grew)}): drain it; a "
            "pending remap is applied by a GPU reset, and if the count keeps growing, hardware: "
            "open a ticket",
        )
    ]


def _fabric(node: str, g: GpuInfo, h: GpuHealth, nh: NodeHealth, busy: int) -> list[Finding]:
    out: list[Finding] = []
    fm = f"; fabric manager: {nh.fabric_manager}"
    start = "start nvidia-fabricmanager, then " if nh.fabric_manager.startswith("not") else ""
    if h.fabric_ready is False:
        status = f", status {h.fabric_status}" if h.fabric_status else ""
        out.append(
            Finding(
                node,
                g.index,
                FABRIC_NOT_READY,
                "",
                f"GPU {g.index}: NVSwitch fabric state {h.fabric_state}{status}{fm}: CUDA jobs "
                f"across GPUs fail until it completes; {start}" + reset_step(node, g.index, busy),
            )
        )
    links = h.links
    if links is not None and links.down and links.up:
        down = ", ".join(str(i) for i in links.down)
        total = len(links.up) + len(links.down)
        out.append(
            Finding(
                node,
                g.index,
                NVLINK_DOWN,
                "",
                f"GPU {g.index}: {len(links.down)} of {total} NVLink links inactive (link {down})"
                f"; {start}" + reset_step(node, g.index, busy) + "; if they stay down after a "
                "reset, drain and reboot, then hardware: open a ticket",
            )
        )
    return out


def _throttle(
    node: str, g: GpuInfo, h: GpuHealth, memory: HealthMemory, new: HealthMemory
) -> list[Finding]:
    if not h.slowdown:
        return []
    new.throttled[(node, g.uuid)] = h.slowdown
    before = memory.throttled.get((node, g.uuid), ())
    if not before:  # a moment is not a finding
        return []
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
    return [
        Finding(
            node,
            g.index,
            GPU_THROTTLED,
            "",
            f"GPU {g.index}: {words} for two sweeps or more{temp}{power}: {step}",
        )
    ]
