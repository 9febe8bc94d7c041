"""Give every process of a snapshot its workload's owner (and names, where a node said them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.workload import Workload, decide_owner

# Turns a workload read from a cgroup into one with names (``core.enrich``); None: unknown.
Namer = Callable[[Workload], Workload | None]


def attribute(
    snap: NodeSnapshot, owner_label: str | None, named: Mapping[tuple[str, str, str], Workload] = {}
) -> NodeSnapshot:
    """Return ``snap`` with each process's workload named (``named``) and owned."""
    uid_names = {p.uid: p.user for p in snap.processes if p.uid is not None and p.user}

    def one(w: Workload | None) -> Workload | None:
        if w is None:
            return None
        w = named.get(w.key, w)
        return decide_owner(w, uid_names, owner_label)

    procs = tuple(_with(p, one(p.workload)) for p in snap.processes)
    return replace(snap, processes=procs)


def _with(p: GpuProcess, w: Workload | None) -> GpuProcess:
    return p if w == p.workload else replace(p, workload=w)
