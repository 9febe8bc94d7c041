"""GPUs that vanished: a node showing fewer GPUs than it has (pure).

A GPU can leave ``nvidia-smi``'s list with no Xid and no error line (leptonai/gpud#591, fixed by
its PR #944; NVIDIA/NVSentinel#684): the list is simply shorter. Each sweep compares, per node,
three things: the GPUs ``nvidia-smi`` listed (the probe's table, a lost GPU's row included: that
one is ``gpu-lost``'s), the NVIDIA display controllers the kernel sees on PCI (the health exec's
sysfs section: vendor 0x10de, class 0x0300xx or 0x0302xx), and how many the node should have:
its ``gpus`` setting, or else the most it has shown since gpubot started (the bus ids every
alerting sweep saw, kept in memory). A GPU the kernel still sees but nvidia-smi does not lost its
driver; one gone from both fell off the bus. Both are one ``gpu-vanished`` finding for the node,
naming the bus ids and which of the two each is missing from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpubot.core.findings import Finding, FindingKind
from gpubot.core.models import NodeSnapshot
from gpubot.core.probe.nvsmi import normal_bus_id

GPU_VANISHED = FindingKind("gpu-vanished", "GPU vanished")


@dataclass
class VanishedMemory:
    """The GPUs' bus ids each node has shown (nvidia-smi or PCI) since gpubot started."""

    buses: dict[str, frozenset[str]] = field(default_factory=dict)


def find_vanished(
    snapshots: Iterable[NodeSnapshot],
    pci: Mapping[str, tuple[str, ...] | None],
    expected: Mapping[str, int],
    memory: VanishedMemory,
) -> tuple[tuple[Finding, ...], VanishedMemory]:
    """Return the ``gpu-vanished`` findings of one sweep and the memory after it.

    ``pci``: each node's GPUs on PCI (None: not read); ``expected``: the nodes' ``gpus`` setting.
    Only nodes whose probe answered are in ``snapshots``: a node not heard from is no vanished GPU.
    """
    out: list[Finding] = []
    new = VanishedMemory(dict(memory.buses))
    for snap in snapshots:
        smi = {b for g in snap.gpus if g.bus_id and (b := normal_bus_id(g.bus_id))}
        unnamed = sum(1 for g in snap.gpus if not g.bus_id or normal_bus_id(g.bus_id) is None)
        kernel = pci.get(snap.node)
        seen = set(kernel or ()) | smi
        before = memory.buses.get(snap.node, frozenset())
        new.buses[snap.node] = frozenset(before | seen)
        driver_lost = sorted(set(kernel or ()) - smi)
        gone = sorted(before - smi - set(kernel or ()))
        should = expected.get(snap.node, len(before | seen))
        shown = len(smi) + unnamed
        unknown = max(0, should - shown - len(driver_lost) - len(gone))
        if not (driver_lost or gone or unknown):
            continue
        out.append(
            Finding(
                snap.node,
                None,
                GPU_VANISHED,
                "",
                _summary(shown, should, driver_lost, gone, unknown, kernel is not None),
            )
        )
    return tuple(out), new


def _summary(
    shown: int, should: int, driver_lost: list[str], gone: list[str], unknown: int, pci_read: bool
) -> str:
    parts = []
    if driver_lost:
        parts.append(
            f"{', '.join(driver_lost)} missing from nvidia-smi only (the kernel still sees "
            "it on PCI: the driver lost it; check the kernel log for an Xid 79 or 119)"
        )
    if gone:
        where = (
            "and from the kernel's PCI devices (fell off the bus)"
            if pci_read
            else ("(the kernel's PCI devices not read)")
        )
        parts.append(f"{', '.join(gone)} missing from nvidia-smi {where}")
    if unknown:
        parts.append(
            f"{unknown} more the node should have, not seen by nvidia-smi"
            + (" nor on PCI" if pci_read else "")
            + " since gpubot started (bus id unknown)"
        )
    return (
        f"nvidia-smi shows {shown} of the node's {max(should, shown)} GPUs: {'; '.join(parts)}. "
        "Drain the node and reboot it; if a GPU stays missing after the reboot, hardware: open a "
        "ticket"
    )
