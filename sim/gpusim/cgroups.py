"""Real cgroups for simulated workloads, in the shapes Docker, Podman, the kubelet, Slurm and
systemd give them, so that ``/proc/PID/cgroup`` of a workload reads as it would on a real box.

Each workload gets fresh ids (a 64-hex container id, a pod UID, a Slurm job id, a unit name) and
a cgroup of its kind in the v2 hierarchy and, when mounted, in the v1 ``name=systemd`` one:

=========== ================================================================================
docker      ``/system.slice/docker-ID.scope``  (dockerd's systemd cgroup driver)
podman      ``/machine.slice/libpod-ID.scope``  (podman's systemd cgroup manager)
kubernetes  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podUID.slice/
            cri-containerd-ID.scope``  (the kubelet's systemd driver, UID with ``_`` for ``-``)
slurm       v2 ``/system.slice/slurmstepd.scope/job_J/step_0/user/task_0``; v1
            ``/slurm/uid_U/job_J/step_0`` (Slurm's cgroup/v2 and cgroup/v1 plugins)
service     ``/system.slice/gpusim-N.service``
session     ``/user.slice/user-UID.slice/session-N.scope``  (systemd-logind)
rootless    ``/user.slice/user-UID.slice/user@UID.service/user.slice/libpod-ID.scope/container``
            (rootless podman under the user's systemd; not in ``KINDS``: only a test that runs
            the process as a subordinate uid places one)
=========== ================================================================================

The v1 ``memory`` hierarchy gets the Slurm layout too, but only when this process sits at its
root: moving a workload out of a memory cgroup that someone else put us in (a sandbox, a CI
runner's job) would take it out of their accounting.

The process is moved in by its parent (``cgroup.procs``) before it may go on, so that nothing it
starts (a respawned child) is ever outside. Every directory is created by this module and
removed by it, leaf first, once its processes are gone: the unique ones (a container's scope, a
job's tree) belong to one fleet; the shared parents (``/system.slice`` on a box without systemd)
are listed in a registry under the temporary directory, guarded by a file lock, so that
concurrent fleets never remove one another's parents and the last one out removes them. A
directory the simulation did not create is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpusim import simstate
from gpusim.errors import SimError
from gpusim.runtime_registry import kill_members, members

KINDS = ("docker", "podman", "kubernetes", "slurm", "service", "session")
REGISTRY = Path(tempfile.gettempdir()) / "gpusim-cgroups.json"
REGISTRY_LOCK = Path(tempfile.gettempdir()) / "gpusim-cgroups.lock"


@dataclass(frozen=True)
class Hierarchies:
    """Where the cgroup hierarchies this module writes to are mounted."""

    v2: str  # the cgroup2 mount
    systemd: str | None = None  # the v1 name=systemd mount
    memory: str | None = None  # the v1 memory mount, when this process is at its root


@dataclass(frozen=True)
class Shape:
    """The cgroup of one workload and the ids it was made from."""

    kind: str
    v2: str  # the path in the v2 hierarchy, as /proc/PID/cgroup shows it
    v1: str  # the path in the v1 hierarchies
    v2_shared: int  # how many leading components are shared parents (the rest are this one's)
    v1_shared: int
    container_id: str | None = None
    pod_uid: str | None = None
    job_id: str | None = None
    unit: str | None = None


@dataclass
class Placement:
    """The directories made for one workload (absolute paths, in the order they were made)."""

    shape: Shape
    owned: list[str] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)  # where its processes go, one per hierarchy
    top: str = ""  # the v2 directory that holds all of it (what a stop kills)


def _unescape(field_: str) -> str:
    """Undo the octal escapes of /proc/self/mountinfo (``\\040`` is a space)."""
    out, i = [], 0
    while i < len(field_):
        if field_[i] == "\\" and field_[i + 1 : i + 4].isdigit():
            out.append(chr(int(field_[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


def find_hierarchies(mountinfo: str, own_cgroup: str) -> Hierarchies | str:
    """Return the hierarchies to use, or why there are none (one line).

    ``mountinfo`` is /proc/self/mountinfo and ``own_cgroup`` /proc/self/cgroup. A mount of a
    subtree (root field not ``/``, as in a container) is no use: paths would not read as made.
    """
    v2 = systemd = memory = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        parts, rest = left.split(), right.split()
        if not sep or len(parts) < 5 or len(rest) < 3 or parts[3] != "/":
            continue
        point, fstype, options = _unescape(parts[4]), rest[0], rest[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup" and "name=systemd" in options and systemd is None:
            systemd = point
        elif fstype == "cgroup" and "memory" in options and memory is None:
            memory = point
    if v2 is None:
        return "no cgroup2 hierarchy is mounted (at its root) on this machine"
    for line in own_cgroup.splitlines():
        _, _, tail = line.partition(":")
        controllers, _, path = tail.partition(":")
        if "memory" in controllers.split(",") and path != "/":
            memory = None  # we sit in someone's memory cgroup: leave the workloads in it too
    return Hierarchies(v2, systemd, memory)


def unavailable() -> str | None:
    """Say in one line why this process cannot create workload cgroups; None when it can."""
    if os.geteuid() != 0:
        return "creating cgroups needs root"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mountinfo = f.read()
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = f.read()
    except OSError as exc:
        return f"cannot read this process's mounts: {exc.strerror}"
    found = find_hierarchies(mountinfo, own)
    if isinstance(found, str):
        return found
    if not os.access(found.v2, os.W_OK) or not os.access(
        os.path.join(found.v2, "cgroup.procs"), os.W_OK
    ):
        return f"the cgroup2 hierarchy at {found.v2} is not writable"
    probe = os.path.join(found.v2, f"gpusim-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        return f"cannot create a cgroup under {found.v2}: {exc.strerror}"
    return None


def make_shape(kind: str, uid: int) -> Shape:
    """Return a fresh cgroup of ``kind`` for a workload of user ``uid`` (random ids)."""
    cid = secrets.token_hex(32)
    if kind == "docker":
        path = f"/system.slice/docker-{cid}.scope"
        return Shape(kind, path, path, 1, 1, container_id=cid)
    if kind == "podman":
        path = f"/machine.slice/libpod-{cid}.scope"
        return Shape(kind, path, path, 1, 1, container_id=cid)
    if kind == "kubernetes":
        pod = str(uuid.uuid4())
        path = (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{pod.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
        )
        return Shape(kind, path, path, 2, 2, container_id=cid, pod_uid=pod)
    if kind == "slurm":
        job = str(1000 + secrets.randbelow(9_000_000))
        v2 = f"/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"
        v1 = f"/slurm/uid_{uid}/job_{job}/step_0"
        return Shape(kind, v2, v1, 2, 2, job_id=job)
    if kind == "service":
        unit = f"gpusim-{1 + secrets.randbelow(999_999)}.service"
        path = f"/system.slice/{unit}"
        return Shape(kind, path, path, 1, 1, unit=unit)
    if kind == "session":
        unit = f"session-{1 + secrets.randbelow(99_999)}.scope"
        path = f"/user.slice/user-{uid}.slice/{unit}"
        return Shape(kind, path, path, 2, 2, unit=unit)
    if kind == "rootless":  # not a spawn kind: its processes run as a subordinate uid
        path = (
            f"/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/"
            f"libpod-{cid}.scope/container"
        )
        return Shape(kind, path, path, 4, 4, container_id=cid)
    raise ValueError(f"unknown cgroup kind {kind!r}")


# ---- the shared registry ---------------------------------------------------------------------


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, list[list[object]]]]:
    """Hold the registry lock; yield ``{"parents": [[dir]], "owned": [[dir, pid, ticks]]}``.

    Entries whose directory is gone are dropped; owned directories of a process that died
    without cleaning up are removed when empty (leaf first).
    """
    fd = os.open(REGISTRY_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            reg = json.loads(REGISTRY.read_text(encoding="utf-8"))
            reg = {"parents": list(reg["parents"]), "owned": list(reg["owned"])}
        except (OSError, ValueError, KeyError, TypeError):
            reg = {"parents": [], "owned": []}
        keep = []
        for entry in sorted(reg["owned"], key=lambda e: -len(str(e[0]))):
            path, pid, ticks = str(entry[0]), int(str(entry[1])), int(str(entry[2]))
            if not os.path.isdir(path):
                continue
            if not simstate.is_alive(pid, ticks):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
                    continue
            keep.append([path, pid, ticks])
        reg["owned"] = keep
        reg["parents"] = [p for p in reg["parents"] if os.path.isdir(str(p[0]))]
        yield reg
        tmp = REGISTRY.with_name(f".{REGISTRY.name}.{os.getpid()}")
        tmp.write_text(json.dumps(reg), encoding="utf-8")
        os.replace(tmp, REGISTRY)
    finally:
        os.close(fd)


def _sweep_parents(reg: dict[str, list[list[object]]]) -> None:
    """Remove the registered shared parents that are empty now (deepest first)."""
    keep = []
    for entry in sorted(reg["parents"], key=lambda e: -len(str(e[0]))):
        try:
            os.rmdir(str(entry[0]))
        except OSError:
            keep.append(entry)  # still in use (ENOTEMPTY, EBUSY), or gone already
    reg["parents"] = keep


# ---- making, filling and removing ------------------------------------------------------------


class CgroupSet:
    """The workload cgroups of one fleet."""

    def __init__(self, hierarchies: Hierarchies) -> None:
        self.h = hierarchies
        self._me = [os.getpid(), simstate.start_ticks(os.getpid()) or 0]

    def create(self, kind: str, uid: int) -> Placement:
        """Make a fresh cgroup of ``kind`` in every hierarchy; retry on an id already taken."""
        for _ in range(5):
            shape = make_shape(kind, uid)
            try:
                return self._create(shape)
            except FileExistsError:
                continue
        raise SimError(f"cannot create a {kind} cgroup: every fresh id was taken")

    def _layouts(self, shape: Shape) -> list[tuple[str, str, int]]:
        out = [(self.h.v2, shape.v2, shape.v2_shared)]
        if self.h.systemd is not None:
            out.append((self.h.systemd, shape.v1, shape.v1_shared))
        if self.h.memory is not None and shape.kind == "slurm":
            out.append((self.h.memory, shape.v1, shape.v1_shared))
        return out

    def _create(self, shape: Shape) -> Placement:
        placement = Placement(shape)
        failed: OSError | None = None
        with _registry() as reg:
            try:
                for root, path, shared in self._layouts(shape):
                    parts = path.strip("/").split("/")
                    for i in range(1, len(parts) + 1):
                        d = os.path.join(root, *parts[:i])
                        if i <= shared:
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(d)
                                reg["parents"].append([d])
                            continue
                        os.mkdir(d)  # FileExistsError for a taken id: the caller retries
                        placement.owned.append(d)
                        reg["owned"].append([d, *self._me])
                        if i == shared + 1 and root == self.h.v2:
                            placement.top = d
                    placement.leaves.append(os.path.join(root, *parts))
            except OSError as exc:
                self._remove(placement, reg)  # and the registry keeps what could not go
                failed = exc
        if isinstance(failed, FileExistsError):
            raise failed
        if failed is not None:
            raise SimError(f"cannot create the cgroup {shape.v2}: {failed.strerror}")
        return placement

    def move(self, placement: Placement, pid: int) -> None:
        """Move ``pid`` into the placement's leaf in every hierarchy; check what it shows."""
        for leaf in placement.leaves:
            try:
                with open(os.path.join(leaf, "cgroup.procs"), "w", encoding="ascii") as f:
                    f.write(str(pid))
            except OSError as exc:
                raise SimError(f"cannot move pid {pid} into {leaf}: {exc.strerror}") from None
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                shown = f.read().splitlines()
        except OSError as exc:
            raise SimError(f"cannot read /proc/{pid}/cgroup: {exc.strerror}") from None
        want = f"0::{placement.shape.v2}"
        if want not in shown:
            raise SimError(
                f"pid {pid} shows {shown!r}, not {want!r}: this process is not in the initial "
                "cgroup namespace"
            )

    def release(self, placement: Placement, timeout_s: float = 5.0) -> list[str]:
        """Kill what is left in the placement, remove its directories; return those left."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for leaf in placement.leaves for p in members(leaf)]
            if not left or time.monotonic() > deadline:
                break
            for leaf in placement.leaves:  # only processes inside a cgroup this fleet made
                kill_members(leaf, placement.shape.v2, signal.SIGKILL)
            time.sleep(0.02)
        with _registry() as reg:
            return self._remove(placement, reg)

    def _remove(self, placement: Placement, reg: dict[str, list[list[object]]]) -> list[str]:
        left = []
        for d in reversed(placement.owned):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        mine = set(placement.owned) - set(left)
        reg["owned"] = [e for e in reg["owned"] if e[0] not in mine]
        _sweep_parents(reg)
        placement.owned = [d for d in placement.owned if d in left]
        return left
