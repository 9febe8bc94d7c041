"""Start a workload on a simulated node: the request checked, the process ready, its identity made.

``SimNode.spawn`` is the entry point; this module holds its parts and the ``Workload`` it returns.
"""

from __future__ import annotations

import base64
import grp
import hashlib
import os
import pwd
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from gpusim import simstate
from gpusim.cgroups import Placement
from gpusim.errors import SimError, SimUsageError
from gpusim.host import NodeHost
from gpusim.node_layout import check_exe_name
from gpusim.people import Accounts
from gpusim.spec import Spec
from gpusim.workload import BEHAVIOURS, GPULESS

READY_TIMEOUT_S = 15.0
FORGE_PAD = 4000  # bytes of padding in a forger's argv: room for the forged text
FORGE_MAX = 2000  # longest forge text (base64 makes it 4/3 longer on the command line)


class _StateOf(Protocol):
    def state(self) -> dict[str, Any]: ...


@dataclass
class Workload:
    """A process (or, for ``respawn``, a supervisor and its child) that a test started."""

    node: str
    pid: int
    start_ticks: int
    gpu: int | None
    mib: int
    behaviour: str
    user: str
    name: str
    supervisor_pid: int | None = None
    supervisor_start_ticks: int | None = None
    # Its cgroup (``spawn(cgroup=...)``) and the identity made for it; None otherwise.
    cgroup_kind: str | None = None  # docker podman kubernetes slurm service session
    cgroup_path: str | None = None  # the v2 path, as the v2 line of /proc/PID/cgroup shows it
    cgroup_v1_path: str | None = None  # the path in the v1 hierarchies (name=systemd, memory)
    container_id: str | None = None  # 64 hex: docker, podman, kubernetes
    container_name: str | None = None
    image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    restart: str | None = None  # docker, podman
    pod_uid: str | None = None  # kubernetes
    pod_namespace: str | None = None
    pod_name: str | None = None
    job_id: str | None = None  # slurm
    job_name: str | None = None
    job_user: str | None = None
    unit: str | None = None  # service: gpusim-N.service; session: session-N.scope
    _node: _StateOf | None = field(default=None, repr=False, compare=False)

    def current_pid(self) -> int | None:
        """Return the pid now holding this workload's GPU (a respawned child's), or None."""
        if self._node is None:
            return None
        live = [a for a in self._node.state()["allocations"] if a["alive"]]
        if self.supervisor_pid is not None:
            mine = [a for a in live if a["supervisor_pid"] == self.supervisor_pid]
            return mine[-1]["pid"] if mine else None
        ok = any(a["pid"] == self.pid and a["start_ticks"] == self.start_ticks for a in live)
        return self.pid if ok else None

    def alive(self) -> bool:
        """Tell whether the process (the supervisor, for ``respawn``) still runs."""
        if self.supervisor_pid is not None and self.supervisor_start_ticks is not None:
            return simstate.is_alive(self.supervisor_pid, self.supervisor_start_ticks)
        return simstate.is_alive(self.pid, self.start_ticks)


@dataclass(frozen=True)
class Request:
    """A checked spawn request: what to run, on which GPU, as whom, in which cgroup."""

    gpu: int | None
    mib: int
    behaviour: str
    pw: pwd.struct_passwd
    name: str
    util_pct: int
    slow_exit_s: float
    forge: str | None
    spec: Spec | None

    def argv(self, lib_dir: Path, state_dir: Path, exe: str) -> list[str]:
        """Return the workload's command line (``gpusim.workload`` reads it)."""
        gpu = -1 if self.gpu is None else self.gpu
        argv = [
            self.name,
            "-S",
            str(lib_dir / "gpusim_workload.py"),
            "--node-dir",
            str(state_dir),
            "--gpu",
            str(gpu),
            "--mib",
            str(self.mib),
            "--behaviour",
            self.behaviour,
            "--util",
            str(self.util_pct),
            "--slow-exit-s",
            str(self.slow_exit_s),
            "--name",
            self.name,
            "--exe",
            exe,
        ]
        if self.forge is not None:
            # Base64, as argv cannot hold NULs; the padding makes room to rewrite argv into.
            forged = base64.b64encode(self.forge.encode()).decode()
            argv += ["--forge", forged, "--pad", "x" * FORGE_PAD]
        return argv


def check_request(
    node: str,
    gpus: int,
    memory_mib: int,
    *,
    gpu: int | None,
    mib: int,
    behaviour: str,
    user: str | None,
    name: str,
    util_pct: int,
    slow_exit_s: float,
    forge: str | None,
    spec: Spec | None,
    people: Accounts | None = None,
) -> Request:
    """Check a spawn on ``node`` (``gpus`` GPUs of ``memory_mib``); ``SimUsageError`` if bad."""
    if spec is not None and spec.restarts:
        if behaviour not in ("normal", "respawn"):
            raise SimUsageError(
                f"restart={spec.restart} restarts a normal process, not {behaviour}"
            )
        behaviour = "respawn"
    if spec is not None and spec.job_user is not None:
        if user is not None and user != spec.job_user:
            raise SimUsageError(f"a Slurm job runs as its user ({spec.job_user}), not {user}")
        user = spec.job_user
    if behaviour not in BEHAVIOURS:
        raise SimUsageError(f"unknown behaviour {behaviour!r} (one of {', '.join(BEHAVIOURS)})")
    if behaviour in GPULESS:
        gpu = None
    elif gpu is None or not 0 <= gpu < gpus:
        raise SimUsageError(
            f"{node}: no GPU {gpu} (this node has GPUs 0-{gpus - 1})"
            if gpu is not None
            else f"{node}: a {behaviour} workload needs a GPU index"
        )
    if not 0 <= mib <= memory_mib:
        raise SimUsageError(f"{node}: {mib} MiB does not fit a {memory_mib} MiB GPU")
    if not 0 <= util_pct <= 100:
        raise SimUsageError(f"utilisation must be 0-100 %, not {util_pct}")
    if slow_exit_s < 0:
        raise SimUsageError(f"slow_exit_s must not be negative, not {slow_exit_s}")
    check_exe_name(name, "process")
    if forge is not None and (not isinstance(forge, str) or len(forge.encode()) > FORGE_MAX):
        raise SimUsageError(f"forge text must be a str of at most {FORGE_MAX} bytes")
    pw = login(user, people or {})
    return Request(gpu, mib, behaviour, pw, name, util_pct, slow_exit_s, forge, spec)


def login(user: str | None, people: Accounts | None = None) -> pwd.struct_passwd:
    """Return the account a workload runs as (ours for None; one of the fleet's ``people``, a
    uid only the fleet names); ``SimUsageError`` if we may not."""
    if user is None:
        return pwd.getpwuid(os.geteuid())
    if people and user in people:
        return people[user]
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise SimUsageError(f"no such user {user!r}") from None
    if pw.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise SimUsageError(f"cannot run a workload as {user!r}: that needs root")
    return pw


def start_process(
    host: NodeHost,
    node: str,
    node_dir: Path,
    log_path: Path,
    argv: list[str],
    exe: str,
    pw: pwd.struct_passwd,
    supervisor: bool,
    placement: Placement | None,
) -> tuple[int, int, subprocess.Popen[bytes]]:
    """Start the process (moved into ``placement`` before it may go on); wait until ready.

    Return the pid and start ticks that hold the GPU (a supervisor's child's) and the process.
    """
    r, w = os.pipe()
    go_r, go_w = os.pipe() if placement is not None else (-1, -1)
    if placement is not None:
        argv = [*argv, "--go-fd", str(go_r)]
    try:
        with open(log_path, "wb") as log:
            proc = _popen(
                node,
                node_dir,
                [*argv, "--ready-fd", str(w)],
                exe,
                pw,
                log,
                (w,) if placement is None else (w, go_r),
            )
        for fd in (w, go_r):
            if fd >= 0:
                os.close(fd)
        w = go_r = -1
        host.track(proc, node if supervisor else None)
        if placement is not None:
            try:
                host.placements.move(placement, proc.pid)
            except SimError:
                proc.kill()
                proc.wait()
                raise
            os.write(go_w, b"g")  # in its cgroup now: it may go on
        line = _read_line(r, READY_TIMEOUT_S)
    finally:
        for fd in (r, w, go_r, go_w):
            if fd >= 0:
                os.close(fd)
    parts = line.split()
    if len(parts) != 3 or parts[0] != "ready":
        proc.kill()
        proc.wait()
        why = _last_line(log_path) or f"no ready line within {READY_TIMEOUT_S:g}s"
        raise SimError(f"{node}: workload did not start: {why}")
    return int(parts[1]), int(parts[2]), proc


def _popen(
    node: str,
    node_dir: Path,
    argv: list[str],
    exe: str,
    pw: pwd.struct_passwd,
    log: BinaryIO,
    fds: tuple[int, ...],
) -> subprocess.Popen[bytes]:
    """Start ``argv`` through ``exe`` as ``pw``, in its own session, stderr to ``log``."""
    env = {
        "PATH": f"{node_dir / 'exe'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": pw.pw_dir or "/",
        "USER": pw.pw_name,
        "LOGNAME": pw.pw_name,
        "LANG": "C.UTF-8",
    }
    extra: dict[str, Any] = {}
    if pw.pw_uid != os.geteuid():
        extra = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    try:
        return subprocess.Popen(
            argv,
            executable=exe,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd="/",
            env=env,
            start_new_session=True,  # a Ctrl-C at the fleet's terminal is not theirs
            **extra,
        )
    except OSError as exc:
        raise SimError(f"{node}: cannot start a workload: {exc}") from None


def identify(
    w: Workload, spec: Spec, placement: Placement, pw: pwd.struct_passwd
) -> dict[str, Any]:
    """Fill in ``w``'s identity (ids, names, its cgroup); return its entry for the registry."""
    shape = placement.shape
    kind = spec.kind
    w.cgroup_kind, w.cgroup_path, w.cgroup_v1_path = kind, shape.v2, shape.v1
    entry = _entry(w, kind, placement, pw)
    if kind in ("docker", "podman", "kubernetes"):
        assert shape.container_id is not None
        suffix = shape.container_id[:6]
        w.container_id = shape.container_id
        w.container_name = spec.name or ("main" if kind == "kubernetes" else f"gpusim_{suffix}")
        w.image = spec.image or "nvcr.io/nvidia/pytorch:24.05-py3"
        w.labels = dict(spec.labels)
        entry.update(id=w.container_id, name=w.container_name, image=w.image, labels=w.labels)
    if kind in ("docker", "podman"):
        w.restart = spec.restart or "no"
        entry["restart"] = w.restart
    if kind == "kubernetes":
        w.pod_namespace, w.pod_name = spec.pod or ("default", f"gpusim-{suffix[:5]}")
        w.pod_uid = shape.pod_uid
        entry["pod"] = {"namespace": w.pod_namespace, "name": w.pod_name, "uid": w.pod_uid}
        entry["sandbox_id"] = hashlib.sha256(f"sandbox/{w.pod_uid}".encode()).hexdigest()
    if kind == "slurm":
        assert shape.job_id is not None
        w.job_id, w.job_name, w.job_user = shape.job_id, spec.job_name or w.name, pw.pw_name
        try:
            group = grp.getgrgid(pw.pw_gid).gr_name
        except KeyError:
            group = str(pw.pw_gid)
        entry.update(id=w.job_id, name=w.job_name)
        entry["job"] = {
            "id": w.job_id,
            "name": w.job_name,
            "user": pw.pw_name,
            "uid": pw.pw_uid,
            "group": group,
            "gid": pw.pw_gid,
            "home": pw.pw_dir or "/",
        }
    if kind in ("service", "session"):
        w.unit = shape.unit
        entry.update(id=w.unit, name=w.unit)
    return entry


def _entry(w: Workload, kind: str, placement: Placement, pw: pwd.struct_passwd) -> dict[str, Any]:
    """Return the registry entry of ``w`` as every kind has it: running, no runtime details."""
    return {
        "kind": kind,
        "image": None,
        "labels": {},
        "restart": None,
        "pod": None,
        "job": None,
        "user": pw.pw_name,
        "uid": pw.pw_uid,
        "gid": pw.pw_gid,
        "gpu": w.gpu,
        "process": w.name,
        "cgroup": placement.shape.v2,
        "top": placement.top,
        "pid": w.pid,
        "start_ticks": w.start_ticks,
        "supervisor_pid": w.supervisor_pid,
        "supervisor_start_ticks": w.supervisor_start_ticks,
        "sandbox_id": None,
        "created": time.time(),
        "state": "running",
        "finished": None,
        "exit_code": None,
    }


def _read_line(fd: int, timeout_s: float) -> str:
    """Read one line from ``fd`` within ``timeout_s`` ('' on EOF or timeout)."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").split("\n", 1)[0]


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
