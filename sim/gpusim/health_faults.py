"""GPU health faults of a simulated node: what its nvidia-smi says about memory repair, ECC, the
NVSwitch fabric, NVLink and throttling, and its fabric manager daemon.

Each state the health checks know has a fault here: ``set_gpu(node, 0, remap_pending=True)``,
``remap_failure``, a growing ``ecc_volatile``/``ecc_aggregate``, ``fabric_state``/
``fabric_status``, ``links_down``, ``slowdown`` (with ``temperature`` and ``power``); node-wide:
``set_node(node, fabric=True, links=18)`` (an NVSwitch box), ``consumer=True`` (a GeForce: every
field ``[N/A]`` or ``[Not Supported]``), ``legacy=True`` (a driver before 535).
``set_workload(node, w, power_w=90)`` makes one workload draw that much (a job wedged at
100 % draws little), ``mib=`` changes the memory it holds (a job loading data).
``start_fabric_manager`` runs a process called ``nv-fabricmanager`` with its pid file.
``vanish(node, 2, from_pci=True)`` takes a GPU out of nvidia-smi's list (and out of the node's
sysfs stand-in, ``SimNode.pci_dir``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpusim import simstate
from gpusim.errors import SimUsageError
from gpusim.node_layout import pci_name

if TYPE_CHECKING:
    from gpusim.node import SimNode
    from gpusim.spawning import Workload

GPU_KEYS = frozenset(
    {
        "ecc_volatile",
        "ecc_aggregate",
        "retired_pending",
        "remap_pending",
        "remap_failure",
        "slowdown",
        "temperature",
        "power",
        "power_limit",
        "fabric_state",
        "fabric_status",
        "links_down",
    }
)
NODE_KEYS = frozenset({"fabric", "links", "consumer", "legacy"})


def set_gpu(node: SimNode, gpu: int, **values: Any) -> None:
    """Set GPU ``gpu``'s health fields (a value None restores its default)."""
    bad = set(values) - GPU_KEYS
    if bad or not 0 <= gpu < node.gpus:
        raise SimUsageError(f"{node.name}: no GPU {gpu} or unknown health fields {sorted(bad)}")
    with simstate.transaction(str(node.state_dir)) as state:
        mine = state.setdefault("health", {}).setdefault("gpus", {}).setdefault(str(gpu), {})
        for k, v in values.items():
            if v is None:
                mine.pop(k, None)
            else:
                mine[k] = list(v) if isinstance(v, tuple | list | set) else v


WORKLOAD_KEYS = frozenset({"power_w", "mib"})


def set_workload(node: SimNode, w: Workload, **values: Any) -> None:
    """Set what workload ``w`` draws (``power_w``; None: its utilisation's share) or holds
    (``mib``), by its pid and start time."""
    bad = set(values) - WORKLOAD_KEYS
    if bad:
        raise SimUsageError(f"{node.name}: unknown workload fields {sorted(bad)}")
    with simstate.transaction(str(node.state_dir)) as state:
        mine = [
            a for a in state["allocs"] if (a["pid"], a["start_ticks"]) == (w.pid, w.start_ticks)
        ]
        if not mine:
            raise SimUsageError(f"{node.name}: no workload pid {w.pid}")
        for a in mine:
            for k, v in values.items():
                if v is None:
                    a.pop(k, None)
                else:
                    a[k] = int(v) if k == "mib" else float(v)


def set_node(node: SimNode, **values: Any) -> None:
    """Set the node's health setting: ``fabric``, ``links``, ``consumer``, ``legacy``."""
    bad = set(values) - NODE_KEYS
    if bad:
        raise SimUsageError(f"{node.name}: unknown node health settings {sorted(bad)}")
    with simstate.transaction(str(node.state_dir)) as state:
        state.setdefault("health", {}).update(values)


def vanish(node: SimNode, gpu: int, *, from_pci: bool) -> None:
    """Make GPU ``gpu`` vanish from nvidia-smi's list, with no error line (leptonai/gpud#591);
    ``from_pci``: from the kernel's PCI devices too (its sysfs folder removed), as a GPU that
    fell off the bus. ``SimNode.clear`` brings it back."""
    if not 0 <= gpu < node.gpus:
        raise SimUsageError(f"{node.name}: no GPU {gpu}")
    with simstate.transaction(str(node.state_dir)) as state:
        health = state.setdefault("health", {})
        health["vanished"] = sorted({*health.get("vanished", ()), gpu})
        bus = str(state["gpus"][gpu]["bus_id"])
    if from_pci:
        shutil.rmtree(Path(node.pci_dir) / pci_name(bus))


def start_fabric_manager(node: SimNode) -> Workload:
    """Run ``nv-fabricmanager`` (a process of that name holding no GPU) and write its pid file."""
    w = node.spawn(None, behaviour="ctl-only", exe_path=node.daemon_exe("nv-fabricmanager"))
    pid_file = Path(node.fabricmanager_pid)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{w.pid}\n", encoding="utf-8")
    return w


def stop_fabric_manager(node: SimNode, w: Workload, *, keep_pid_file: bool = False) -> None:
    """Stop the fabric manager started by ``start_fabric_manager`` (by pid and start time)."""
    simstate.signal_if(w.pid, w.start_ticks, 9)
    if not keep_pid_file:
        Path(node.fabricmanager_pid).unlink(missing_ok=True)


def pid_file_exists(node: SimNode) -> bool:
    """Whether the node's fabric manager pid file is there."""
    return os.path.exists(node.fabricmanager_pid)
