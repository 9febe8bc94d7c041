"""One simulated GPU node: its directory, device files, stand-in nvidia-smi and workloads."""

from __future__ import annotations

import base64
import contextlib
import grp
import hashlib
import itertools
import json
import os
import pwd
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubot.errors import SimError, UsageError
from gpubot.sim import runtimes, simstate
from gpubot.sim.cgroups import Placement, Spec, make_spec
from gpubot.sim.nvidia_smi import APP_ALIASES, APP_FIELDS, GPU_ALIASES, GPU_FIELDS
from gpubot.sim.server import _signal_if
from gpubot.sim.sudo import node_rule
from gpubot.sim.workload import BEHAVIOURS, PAGE

if TYPE_CHECKING:
    from gpubot.sim.fleet import SimFleet

FAULTS = ("hang", "slow", "missing", "garbled", "driver-error", "inforom", "lost", "stuck")
LOST_STYLES = ("index-bus", "bus", "index")  # the three shapes drivers print
# PCI bus ids of the eight GPUs of an HGX H100/H200 board, as nvidia-smi prints them.
HGX_BUS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
READY_TIMEOUT_S = 15.0
FORGE_PAD = 4000  # bytes of padding in a forger's argv: room for the forged text
FORGE_MAX = 2000  # longest forge text (base64 makes it 4/3 longer on the command line)


def gpu_uuid(node: str, index: int) -> str:
    """Return the stable UUID of GPU ``index`` of ``node``."""
    h = hashlib.sha256(f"gpusim/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def bus_id(index: int) -> str:
    """Return the PCI bus id of GPU ``index``."""
    bus = HGX_BUS[index] if index < len(HGX_BUS) else f"{0xE0 + index - len(HGX_BUS):02X}"
    return f"00000000:{bus}:00.0"


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
    _node: SimNode | None = field(default=None, repr=False, compare=False)

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


class SimNode:
    """A simulated node: a state directory, device files and real processes."""

    def __init__(
        self,
        fleet: SimFleet,
        name: str,
        index: int,
        root: Path,
        gpus: int,
        model: str,
        memory_mib: int,
        release_delay_s: float,
        minors: Sequence[int] | None = None,
    ) -> None:
        self.fleet = fleet
        self.name = name
        self.index = index
        self.dir = root / name
        self.state_dir = self.dir / "state"
        self.gpus = gpus
        self.model = model
        self.memory_mib = memory_mib
        self.dev_prefix = str(self.dir / "dev" / "nvidia")
        self.nvidia_smi = str(self.dir / "bin" / "nvidia-smi")
        # GPU index i opens {dev_prefix}{minors[i]}; the driver's folder says so per bus id.
        self.minors = list(minors) if minors is not None else list(range(gpus))
        self.driver_dir = str(self.dir / "driver")
        # The sudo stand-in (a fleet started with sudo_rule=): its directory comes first on PATH.
        self.sudo = False
        self.sudo_dir = self.dir / "sbin-sudo"
        self.sudo_rule_path = self.dir / "sudoers.json"
        self.sudo_log_path = self.dir / "log" / "sudo.jsonl"
        # The docker/podman/crictl/scontrol/scancel/systemctl stand-ins (``runtimes=True``).
        self.runtimes = False
        self.runtime_dir = self.dir / "runtime-bin"
        self.port = 0
        self._initial_delay = release_delay_s
        self._seq = itertools.count(1)  # next() is atomic: control threads may spawn at once

    # ---- layout ---------------------------------------------------------------------------

    def create(self, lib_dir: Path, python: str) -> None:
        """Create the node's directories, device files, state and nvidia-smi launcher."""
        for sub, mode in (("", 0o755), ("dev", 0o755), ("bin", 0o755), ("exe", 0o755),
                          ("log", 0o755), ("state", 0o777), ("state/run", 0o777)):  # fmt: skip
            d = self.dir / sub
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, mode)  # workloads of other users write their records here
        names = [f"nvidia{m}" for m in self.minors] + ["nvidiactl", "nvidia-uvm"]
        for n in names:
            path = self.dir / "dev" / n
            path.write_bytes(b"\0" * PAGE)  # one page, so that workloads can map it
            os.chmod(path, 0o666)
        gpus = [
            {
                "index": i,
                "uuid": gpu_uuid(self.name, i),
                "name": self.model,
                "memory_total": self.memory_mib,
                "bus_id": bus_id(i),
                "minor": self.minors[i],
            }
            for i in range(self.gpus)
        ]
        for g in gpus:
            self._write_information(g)
        lock = self.state_dir / simstate.LOCK_FILE
        lock.touch()
        os.chmod(lock, 0o666)
        with simstate.locked(str(self.state_dir)):
            state = simstate.new_state(self.name, gpus, self.dev_prefix, self._initial_delay)
            simstate.save(str(self.state_dir), state)
        launcher = (
            f"#!{python} -S\n"
            f'"""nvidia-smi of the simulated node {self.name}."""\n'
            "import sys\n"
            f"sys.path.insert(0, {str(lib_dir)!r})\n"
            "from gpusim.nvidia_smi import main\n"
            f"sys.exit(main(sys.argv[1:], {str(self.state_dir)!r}))\n"
        )
        smi = Path(self.nvidia_smi)
        smi.write_text(launcher, encoding="utf-8")
        os.chmod(smi, 0o755)

    def create_sudo(self, lib_dir: Path, python: str, rule: dict[str, Any]) -> None:
        """Install the sudo stand-in: ``sbin-sudo/sudo``, this node's rule file and its log.

        ``rule`` is ``gpubot.sim.sudo.parse_sudoers`` of the README's block; its device and
        nvidia-smi paths are rewritten to this node's.
        """
        # The runtime programs always point into the node (installed or not): a sudo node never
        # reaches this machine's own docker or systemctl.
        mine = node_rule(rule, self.name, self.dev_prefix, self.nvidia_smi, str(self.sudo_log_path),
                         programs=self.runtime_programs())  # fmt: skip
        self.sudo_rule_path.write_text(json.dumps(mine, indent=2) + "\n", encoding="utf-8")
        os.chmod(self.sudo_rule_path, 0o644)
        self.sudo_log_path.write_bytes(b"")
        os.chmod(self.sudo_log_path, 0o644)
        self.sudo_dir.mkdir(exist_ok=True)
        os.chmod(self.sudo_dir, 0o755)
        launcher = (
            f"#!{python} -S\n"
            f'"""sudo of the simulated node {self.name}: only the rule commands, with -n."""\n'
            "import sys\n"
            f"sys.path.insert(0, {str(lib_dir)!r})\n"
            "from gpusim.sudo import main\n"
            f"sys.exit(main(sys.argv[1:], {str(self.sudo_rule_path)!r}))\n"
        )
        sudo = self.sudo_dir / "sudo"
        sudo.write_text(launcher, encoding="utf-8")
        os.chmod(sudo, 0o755)
        self.sudo = True

    def runtime_programs(self) -> dict[str, str]:
        """Return where this node's runtime stand-ins are (or would be): name -> path."""
        return {prog: str(self.runtime_dir / prog) for prog in runtimes.PROGRAMS}

    def create_runtimes(self, lib_dir: Path, python: str) -> None:
        """Install the stand-ins ``docker``, ``podman``, ``crictl``, ``scontrol``, ``scancel``
        and ``systemctl`` in ``runtime-bin/`` (see ``gpubot.sim.runtimes``)."""
        self.runtime_dir.mkdir(exist_ok=True)
        os.chmod(self.runtime_dir, 0o755)
        for prog, path in self.runtime_programs().items():
            Path(path).write_text(
                f"#!{python} -S\n"
                f'"""{prog} of the simulated node {self.name} (gpubot.sim.runtimes)."""\n'
                "import sys\n"
                f"sys.path.insert(0, {str(lib_dir)!r})\n"
                "from gpusim.runtimes import main\n"
                f"sys.exit(main({prog!r}, sys.argv[1:], {str(self.state_dir)!r}))\n",
                encoding="utf-8",
            )
            os.chmod(path, 0o755)
        self.runtimes = True

    def set_runtime_delay(self, seconds: float) -> None:
        """Make every runtime stand-in of this node sleep ``seconds`` before it answers."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise UsageError(f"runtime delay must be a number of seconds >= 0, not {seconds!r}")
        runtimes.set_delay(str(self.state_dir), float(seconds))

    def registry(self) -> list[dict[str, Any]]:
        """Return the node's container/job registry (``gpubot.sim.runtimes`` documents it)."""
        with simstate.locked(str(self.state_dir)):
            entries: list[dict[str, Any]] = runtimes.load(str(self.state_dir))["entries"]
        return entries

    def sudo_log(self) -> list[dict[str, Any]]:
        """Return every call of this node's sudo stand-in, oldest first ([] without one).

        Each is ``{"argv", "command", "allowed", "verdict", "node", "pid", "uid", "time"}``
        (+ ``"reason"`` when refused): ``argv`` as sudo got it, ``command`` the resolved
        command line it checked (None if it never got that far), ``verdict`` one of ``run``,
        ``denied``, ``not-found``, ``no-n``, ``usage``.
        """
        try:
            text = self.sudo_log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def device(self, gpu: int) -> str:
        """Return the device file of GPU ``gpu`` (index): the one named by its minor."""
        return f"{self.dev_prefix}{self.minors[gpu]}"

    def _write_information(self, g: dict[str, Any]) -> None:
        """Write the driver's ``gpus/<bus id>/information`` of one GPU, in the real layout."""
        domain, rest = g["bus_id"].split(":", 1)
        bus = f"{int(domain, 16):04x}:{rest.lower()}"
        folder = Path(self.driver_dir) / "gpus" / bus
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "information").write_text(
            f"Model: \t\t {g['name']}\nIRQ:   \t\t {200 + g['index']}\n"
            f"GPU UUID: \t {g['uuid']}\nVideo BIOS: \t 96.00.74.00.11\nBus Type: \t PCIe\n"
            f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {g['minor']}\nGPU Excluded:\t No\n",
            encoding="utf-8",
        )

    # ---- workloads ------------------------------------------------------------------------

    def spawn(
        self,
        gpu: int | None,
        mib: int = 1024,
        behaviour: str = "normal",
        user: str | None = None,
        name: str = "python3",
        util_pct: int = 50,
        slow_exit_s: float = 3.0,
        forge: str | None = None,
        exe_path: str | None = None,
        *,
        cgroup: str | None = None,
        container_name: str | None = None,
        image: str | None = None,
        labels: Mapping[str, str] | None = None,
        restart: str | None = None,
        pod: str | None = None,
        job_name: str | None = None,
        job_user: str | None = None,
    ) -> Workload:
        """Start a workload process on GPU ``gpu`` and return once it holds the GPU.

        ``forge``: once ready, the process keeps rewriting its argv and comm to this text, with
        ``{token}`` replaced by the latest hex token seen in another process's command line and
        ``{pid}`` by its pid (see ``gpubot.sim.workload``); it may hold newlines and NULs.
        ``exe_path``: run through a copy of the interpreter at this path inside the node's
        directory (see ``daemon_exe``): ``/proc/PID/exe`` shows it, comm is its basename.

        ``cgroup`` (docker, podman, kubernetes, slurm, service, session): the process (for
        ``respawn``, its supervisor) is moved into a fresh real cgroup of that shape before it
        starts anything (see ``gpubot.sim.cgroups``), and the node's registry records it for the
        runtime stand-ins. Containers take ``container_name``, ``image``, ``labels``; docker and
        podman a ``restart`` policy (``always``, ``on-failure``, ``unless-stopped``: the
        ``respawn`` behaviour, the supervisor standing in for the daemon's restart manager, until
        ``docker stop``); kubernetes a ``pod`` (``NAMESPACE/NAME``); slurm ``job_name`` and
        ``job_user`` (whom the job runs as). ``SimError`` when cgroups cannot be made here.
        """
        spec = make_spec(cgroup, container_name=container_name, image=image, labels=labels,
                         restart=restart, pod=pod, job_name=job_name,
                         job_user=job_user)  # fmt: skip
        if spec is not None and spec.restarts:
            if behaviour not in ("normal", "respawn"):
                raise UsageError(
                    f"restart={spec.restart} restarts a normal process, not {behaviour}"
                )
            behaviour = "respawn"
        if spec is not None and spec.job_user is not None:
            if user is not None and user != spec.job_user:
                raise UsageError(f"a Slurm job runs as its user ({spec.job_user}), not {user}")
            user = spec.job_user
        if behaviour not in BEHAVIOURS:
            raise UsageError(f"unknown behaviour {behaviour!r} (one of {', '.join(BEHAVIOURS)})")
        if behaviour in ("ctl-only", "persistenced"):
            gpu = None
        elif gpu is None or not 0 <= gpu < self.gpus:
            raise UsageError(
                f"{self.name}: no GPU {gpu} (this node has GPUs 0-{self.gpus - 1})"
                if gpu is not None
                else f"{self.name}: a {behaviour} workload needs a GPU index"
            )
        if not 0 <= mib <= self.memory_mib:
            raise UsageError(f"{self.name}: {mib} MiB does not fit a {self.memory_mib} MiB GPU")
        if not 0 <= util_pct <= 100:
            raise UsageError(f"utilisation must be 0-100 %, not {util_pct}")
        if slow_exit_s < 0:
            raise UsageError(f"slow_exit_s must not be negative, not {slow_exit_s}")
        if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > 100:
            raise UsageError(f"bad process name {name!r}")
        if forge is not None and (not isinstance(forge, str) or len(forge.encode()) > FORGE_MAX):
            raise UsageError(f"forge text must be a str of at most {FORGE_MAX} bytes")
        pw = self._user(user)
        if spec is not None and spec.kind in ("docker", "podman") and spec.name is not None:
            taken = {e["name"] for e in self.registry() if e["kind"] == spec.kind}
            if spec.name in taken:  # as the daemon's "Conflict. The container name ... is in use"
                raise UsageError(f'{self.name}: the container name "{spec.name}" is already in use')
        exe = self._exe(name) if exe_path is None else self._interpreter_copy(exe_path)
        argv = [name, "-S", str(self.fleet.lib_dir / "gpusim_workload.py"),
                "--node-dir", str(self.state_dir), "--gpu", str(-1 if gpu is None else gpu),
                "--mib", str(mib), "--behaviour", behaviour, "--util", str(util_pct),
                "--slow-exit-s", str(slow_exit_s), "--name", name, "--exe", exe]  # fmt: skip
        if forge is not None:
            # Base64, as argv cannot hold NULs; the padding makes room to rewrite argv into.
            argv += ["--forge", base64.b64encode(forge.encode()).decode(), "--pad", "x" * FORGE_PAD]
        placement = None
        if spec is not None:
            placement = self.fleet._place(self.name, spec.kind, pw.pw_uid)
        try:
            pid, ticks, proc = self._start(argv, exe, pw, behaviour, placement)
        except BaseException:
            if placement is not None:
                self.fleet._unplace(self.name, placement)
            raise
        sup_ticks = simstate.start_ticks(proc.pid) if behaviour == "respawn" else None
        self.fleet._watch(str(self.state_dir), pid, ticks)
        w = Workload(
            node=self.name,
            pid=pid,
            start_ticks=ticks,
            gpu=gpu,
            mib=0 if behaviour in ("ctl-only", "persistenced") else mib,
            behaviour=behaviour,
            user=pw.pw_name,
            name=name,
            supervisor_pid=proc.pid if behaviour == "respawn" else None,
            supervisor_start_ticks=sup_ticks,
            _node=self,
        )
        if spec is not None and placement is not None:
            self._register(w, spec, placement, pw)
        return w

    def _start(
        self,
        argv: list[str],
        exe: str,
        pw: pwd.struct_passwd,
        behaviour: str,
        placement: Placement | None,
    ) -> tuple[int, int, subprocess.Popen[bytes]]:
        """Start the process (moved into ``placement`` before it may go on); wait until ready."""
        env = {
            "PATH": f"{self.dir / 'exe'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": pw.pw_dir or "/",
            "USER": pw.pw_name,
            "LOGNAME": pw.pw_name,
            "LANG": "C.UTF-8",
        }
        log_path = self.dir / "log" / f"workload-{next(self._seq)}.log"
        r, w = os.pipe()
        go_r, go_w = os.pipe() if placement is not None else (-1, -1)
        fds = (w,) if placement is None else (w, go_r)
        if placement is not None:
            argv = [*argv, "--go-fd", str(go_r)]
        try:
            with open(log_path, "wb") as log:
                extra: dict[str, Any] = {}
                if pw.pw_uid != os.geteuid():
                    extra = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
                try:
                    proc = subprocess.Popen(
                        [*argv, "--ready-fd", str(w)],
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
                    raise SimError(f"{self.name}: cannot start a workload: {exc}") from None
            for fd in (w, go_r):
                if fd >= 0:
                    os.close(fd)
            w = go_r = -1
            self.fleet._track(proc, self.name if behaviour == "respawn" else None)
            if placement is not None:
                try:
                    self.fleet._move(placement, proc.pid)
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
            raise SimError(f"{self.name}: workload did not start: {why}")
        return int(parts[1]), int(parts[2]), proc

    def _register(
        self, w: Workload, spec: Spec, placement: Placement, pw: pwd.struct_passwd
    ) -> None:
        """Fill in ``w``'s identity and record it in the node's registry for the stand-ins."""
        shape = placement.shape
        kind = spec.kind
        w.cgroup_kind, w.cgroup_path, w.cgroup_v1_path = kind, shape.v2, shape.v1
        entry: dict[str, Any] = {
            "kind": kind, "image": None, "labels": {}, "restart": None, "pod": None,
            "job": None, "user": pw.pw_name, "uid": pw.pw_uid, "gid": pw.pw_gid, "gpu": w.gpu,
            "process": w.name, "cgroup": shape.v2, "top": placement.top, "pid": w.pid,
            "start_ticks": w.start_ticks, "supervisor_pid": w.supervisor_pid,
            "supervisor_start_ticks": w.supervisor_start_ticks, "sandbox_id": None,
            "created": time.time(), "state": "running", "finished": None, "exit_code": None,
        }  # fmt: skip
        if kind in ("docker", "podman", "kubernetes"):
            assert shape.container_id is not None
            suffix = shape.container_id[:6]
            w.container_id = shape.container_id
            w.container_name = spec.name or ("main" if kind == "kubernetes" else f"gpusim_{suffix}")
            w.image = spec.image or "nvcr.io/nvidia/pytorch:24.05-py3"
            w.labels = dict(spec.labels)
            entry.update(id=w.container_id, name=w.container_name, image=w.image,
                         labels=w.labels)  # fmt: skip
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
            entry["job"] = {"id": w.job_id, "name": w.job_name, "user": pw.pw_name,
                            "uid": pw.pw_uid, "group": group, "gid": pw.pw_gid,
                            "home": pw.pw_dir or "/"}  # fmt: skip
        if kind in ("service", "session"):
            w.unit = shape.unit
            entry.update(id=w.unit, name=w.unit)
        runtimes.register(str(self.state_dir), entry)

    def daemon_exe(self, name: str) -> str:
        """Return ``<node dir>/sbin/<name>``, a copy of the interpreter, made on first use."""
        if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > 100:
            raise UsageError(f"bad executable name {name!r}")
        sbin = Path(os.path.realpath(self.dir)) / "sbin"
        sbin.mkdir(exist_ok=True)
        os.chmod(sbin, 0o755)  # workloads of other users exec from it
        return self._interpreter_copy(str(sbin / name))

    def _interpreter_copy(self, path: str) -> str:
        """Make ``path`` (inside the node's directory) a copy of the interpreter; return it."""
        target = Path(os.path.realpath(os.path.abspath(path)))
        if not target.is_relative_to(os.path.realpath(self.dir)):
            raise UsageError(f"{self.name}: {path!r} is outside the node's directory {self.dir}")
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise UsageError(f"{self.name}: {path!r} is not a regular file")
        if not target.exists():
            # A link of a finished copy: a racing spawn never execs a half-written file, and
            # a running daemon's file is never replaced (its /proc/PID/exe would say deleted).
            tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
            try:
                shutil.copyfile(self.fleet.python_real, tmp)
                os.chmod(tmp, 0o755)
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, target)
            except OSError as exc:
                why = f"cannot copy the interpreter to {path}: {exc}"
                raise SimError(f"{self.name}: {why}") from None
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        return str(target)

    def _user(self, user: str | None) -> pwd.struct_passwd:
        if user is None:
            return pwd.getpwuid(os.geteuid())
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise UsageError(f"no such user {user!r}") from None
        if pw.pw_uid != os.geteuid() and os.geteuid() != 0:
            raise UsageError(f"cannot run a workload as {user!r}: that needs root")
        return pw

    def _exe(self, name: str) -> str:
        """Return a link named ``name`` to the interpreter: exec'd through it, comm is ``name``."""
        link = self.dir / "exe" / name
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(self.fleet.python_real)
        return str(link)

    # ---- faults, overrides, state ---------------------------------------------------------

    def set_fault(self, kind: str | None, **params: Any) -> None:
        """Set the nvidia-smi fault: hang, slow (delay_s), missing, garbled, driver-error,
        inforom (exit 14 with the warning), lost (gpu, style: GPU ``gpu`` fell off the bus),
        stuck (hold_s: every call hangs and leaves a copy no kill reaches), None. Clearing the
        fault ends the stuck copies.
        """
        if kind is not None and kind not in FAULTS:
            raise UsageError(f"unknown fault {kind!r} (one of {', '.join(FAULTS)}, or none)")
        allowed = {"slow": {"delay_s"}, "lost": {"gpu", "style"}, "stuck": {"hold_s"}}.get(
            kind or "", set()
        )
        if set(params) - allowed:
            raise UsageError(f"fault {kind}: unknown parameter(s) {sorted(set(params) - allowed)}")
        fault: dict[str, Any] = {"kind": kind}
        if kind == "slow":
            delay = params.get("delay_s", 5.0)
            if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
                raise UsageError(f"fault slow: delay_s must be a number >= 0, not {delay!r}")
            fault["delay_s"] = float(delay)
        if kind == "stuck":
            fault["hold_s"] = float(params.get("hold_s", 60.0))
        if kind is None:
            self.unstick()
        if kind == "lost":
            gpu, style = params.get("gpu", 0), params.get("style", "index-bus")
            if not isinstance(gpu, int) or not 0 <= gpu < self.gpus or style not in LOST_STYLES:
                raise UsageError(f"fault lost: gpu 0-{self.gpus - 1}, style one of {LOST_STYLES}")
            fault.update(gpu=gpu, style=style)
        smi = Path(self.nvidia_smi)
        hidden = smi.with_name(".nvidia-smi.missing")
        if kind != "missing" and hidden.exists():
            os.replace(hidden, smi)
        with simstate.transaction(str(self.state_dir)) as state:
            state["fault"] = fault
        if kind == "missing" and smi.exists():
            os.replace(smi, hidden)  # the shell itself answers 127, as on a box without a driver

    def set_mig(self, gpu: int, enabled: bool) -> None:
        """Put GPU ``gpu`` in MIG mode (``mig.mode.current`` says Enabled) or take it out."""
        if not 0 <= gpu < self.gpus:
            raise UsageError(f"{self.name}: no GPU {gpu}")
        with simstate.transaction(str(self.state_dir)) as state:
            state["gpus"][gpu]["mig"] = "Enabled" if enabled else "Disabled"

    def override(self, query: str, fld: str, text: str | None, gpu: int | None = None) -> None:
        """Make nvidia-smi print ``text`` (e.g. ``[N/A]``) for a field; None restores the value.

        ``query`` is ``"gpu"`` (``--query-gpu``; ``gpu=None`` means every GPU) or ``"apps"``
        (``--query-compute-apps``, every row).
        """
        if query == "gpu":
            canon = GPU_ALIASES.get(fld, fld)
            if canon not in GPU_FIELDS:
                raise UsageError(f"unknown --query-gpu field {fld!r}")
            if gpu is not None and not 0 <= gpu < self.gpus:
                raise UsageError(f"{self.name}: no GPU {gpu}")
            slot = "*" if gpu is None else str(gpu)
        elif query == "apps":
            canon = APP_ALIASES.get(fld, fld)
            if canon not in APP_FIELDS:
                raise UsageError(f"unknown --query-compute-apps field {fld!r}")
            slot = ""
        else:
            raise UsageError(f"query must be 'gpu' or 'apps', not {query!r}")
        with simstate.transaction(str(self.state_dir)) as state:
            table = state["overrides"][query]
            target = table.setdefault(slot, {}) if query == "gpu" else table
            if text is None:
                target.pop(canon, None)
            else:
                target[canon] = text
            if query == "gpu" and not target:
                table.pop(slot, None)

    @property
    def release_delay_s(self) -> float:
        """Seconds between a process's death and the release of its memory."""
        with simstate.locked(str(self.state_dir)):
            return float(simstate.load(str(self.state_dir))["release_delay_s"])

    @release_delay_s.setter
    def release_delay_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise UsageError(f"release delay must be a number of seconds >= 0, not {value!r}")
        with simstate.transaction(str(self.state_dir)) as state:
            state["release_delay_s"] = float(value)

    def state(self) -> dict[str, Any]:
        """Return the node's GPUs, allocations and fault as plain data."""
        with simstate.transaction(str(self.state_dir)) as st:
            now = time.time()
            simstate.refresh(st, now)
            usage = simstate.gpu_usage(st, now)
            return {
                "node": self.name,
                "port": self.port,
                "release_delay_s": st["release_delay_s"],
                "fault": st["fault"],
                "gpus": [
                    {
                        "index": g["index"],
                        "uuid": g["uuid"],
                        "name": g["name"],
                        "bus_id": g["bus_id"],
                        "memory_total_mib": g["memory_total"],
                        "memory_used_mib": usage[g["index"]][0],
                        "utilization_pct": usage[g["index"]][1],
                    }
                    for g in st["gpus"]
                ],
                "allocations": [simstate.view(a, st, now) for a in st["allocs"]],
            }

    # ---- servers --------------------------------------------------------------------------

    def stop_server(self) -> None:
        """Stop this node's SSH server (and drop its connections): the port refuses."""
        self.fleet._servers_for(self).stop(self.name)

    def start_server(self) -> None:
        """Start this node's SSH server again on the same port."""
        self.fleet._start_server(self)

    def hang_server(self) -> None:
        """Replace the SSH server by a listener that accepts TCP and never speaks SSH."""
        self.fleet._hang_server(self)

    def ssh_argv(self, *remote: str) -> list[str]:
        """Return an OpenSSH client command line that runs ``remote`` (joined) on this node."""
        f = self.fleet
        return [
            "ssh", "-i", str(f.client_key), "-p", str(self.port),
            "-o", f"UserKnownHostsFile={f.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes", "-F", "/dev/null",
            f"{f.user}@127.0.0.1", shlex.join(remote),
        ]  # fmt: skip

    def kill_workloads(self, timeout_s: float = 5.0) -> int:
        """SIGKILL every live workload of this node (supervisors first); return how many."""
        killed = self.fleet._kill_supervisors(self.name)
        for pid, ticks in self.live_pids():
            if _signal_if(pid, ticks, signal.SIGKILL):
                killed += 1
        deadline = time.monotonic() + timeout_s
        while self.live_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        return killed

    def clear(self) -> None:
        """Kill the workloads and forget them, clear the fault, the overrides and the sudo log;
        remove the workloads' cgroups and empty the registry (and the stand-ins' delay)."""
        self.kill_workloads()
        self.fleet._release_cgroups(self.name)
        runtimes.clear(str(self.state_dir))
        self.set_fault(None)
        if self.sudo:
            self.sudo_log_path.write_bytes(b"")
        with simstate.transaction(str(self.state_dir)) as state:
            state["allocs"] = []
            state["overrides"] = {"gpu": {}, "apps": {}}

    def live_pids(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of every live registered process of this node."""
        with simstate.locked(str(self.state_dir)):
            st = simstate.load(str(self.state_dir))
        return [
            (a["pid"], a["start_ticks"])
            for a in st["allocs"]
            if simstate.is_alive(a["pid"], a["start_ticks"])
        ]

    def stuck_smi(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of the stuck copies (fault ``stuck``) still there."""
        out = []
        for p in (self.state_dir / "run").glob("stuck-*"):
            with contextlib.suppress(ValueError):
                pid, ticks = (int(x) for x in p.name.split("-")[1:3])
                if simstate.is_alive(pid, ticks):
                    out.append((pid, ticks))
        return out

    def unstick(self) -> None:
        """End the stuck copies (by pid and start time) and forget them."""
        for pid, ticks in self.stuck_smi():
            if simstate.is_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for p in (self.state_dir / "run").glob("stuck-*"):
            with contextlib.suppress(OSError):
                p.unlink()

    def hung_smi(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of the stand-in's calls that hang now."""
        out = []
        for p in (self.state_dir / "run").glob("smi-*"):
            try:
                pid, ticks = (int(x) for x in p.name.split("-")[1:3])
            except ValueError:
                continue
            if simstate.is_alive(pid, ticks):
                out.append((pid, ticks))
            else:  # killed before it could clean up
                with contextlib.suppress(OSError):
                    p.unlink()
        return out


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
