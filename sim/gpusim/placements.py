"""The cgroups made for a fleet's workloads, node by node: made on demand, removed at the end."""

from __future__ import annotations

import threading

from gpusim import cgroups
from gpusim.cgroups import CgroupSet, Placement
from gpusim.errors import SimError


class Placements:
    """Every workload cgroup of one fleet, by node; the hierarchies are found on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cgroups: CgroupSet | None = None
        self._made: dict[str, list[Placement]] = {}  # node -> the cgroups made for it

    def place(self, node: str, kind: str, uid: int) -> Placement:
        """Make a fresh cgroup of ``kind`` for a workload of ``node``; remember it."""
        with self._lock:
            if self._cgroups is None:
                why = cgroups.unavailable()
                if why is not None:
                    raise SimError(f"cannot put workloads in cgroups here: {why}")
                with open("/proc/self/mountinfo", encoding="utf-8") as f:
                    mountinfo = f.read()
                with open("/proc/self/cgroup", encoding="utf-8") as f:
                    found = cgroups.find_hierarchies(mountinfo, f.read())
                if isinstance(found, str):
                    raise SimError(f"cannot put workloads in cgroups here: {found}")
                self._cgroups = CgroupSet(found)
            cgs = self._cgroups
        placement = cgs.create(kind, uid)
        with self._lock:
            self._made.setdefault(node, []).append(placement)
        return placement

    def move(self, placement: Placement, pid: int) -> None:
        """Move ``pid`` into ``placement`` (made by ``place``)."""
        assert self._cgroups is not None
        self._cgroups.move(placement, pid)

    def unplace(self, node: str, placement: Placement) -> None:
        """Remove one workload's cgroup (its processes are killed first) and forget it."""
        with self._lock:
            mine = self._made.get(node, [])
            if placement in mine:
                mine.remove(placement)
        if self._cgroups is not None:
            self._cgroups.release(placement)

    def release(self, node: str | None = None) -> list[str]:
        """Remove the cgroups made for ``node``'s workloads (every node's: None); return the
        directories that could not be removed."""
        with self._lock:
            names = [node] if node is not None else list(self._made)
            todo = [p for n in names for p in self._made.pop(n, [])]
        left: list[str] = []
        if self._cgroups is not None:
            for placement in reversed(todo):
                left += self._cgroups.release(placement)
        return left
