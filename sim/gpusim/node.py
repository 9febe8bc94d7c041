"""One simulated GPU node: its directory, device files, stand-in nvidia-smi and workloads.

The node's files are laid out by ``node_layout``, its workloads started by ``spawning``; what it
needs from its fleet (the driver, cgroups, SSH servers) it asks through ``host.NodeHost``.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpusim import adopt, node_layout, runtime_registry, runtimes, simstate, smi_faults
from gpusim.errors import SimUsageError
from gpusim.host import NodeHost
from gpusim.kernlog_host import KernelLog
from gpusim.node_layout import bus_id, gpu_uuid
from gpusim.nvidia_smi import canonical_field
from gpusim.server import client_argv
from gpusim.smi_faults import FAULTS, LOST_STYLES
from gpusim.spawning import Request, Workload, check_request, identify, start_process
from gpusim.spec import Spec, make_spec
from gpusim.sudo import read_log
from gpusim.sudoers import node_rule
from gpusim.workload import GPULESS

__all__ = ["FAULTS", "LOST_STYLES", "SimNode", "Workload", "bus_id", "gpu_uuid"]


class SimNode:
    """A simulated node: a state directory, device files and real processes."""

    def __init__(
        self,
        fleet: NodeHost,
        name: str,
        index: int,
        root: Path,
        gpus: int,
        model: str,
        memory_mib: int,
        release_delay_s: float,
        minors: Sequence[int] | None = None,
    ) -> None:
        self.fleet = fleet  # the fleet that runs this node, as the node may use it
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
        self.pci_dir = str(self.dir / "pci")  # the kernel's PCI devices: a sysfs stand-in
        self.fabricmanager_pid = str(self.dir / "run" / "nvidia-fabricmanager" / "fm.pid")
        # The sudo stand-in (a fleet started with sudo_rule=): its directory comes first on PATH.
        self.sudo = False
        self.sudo_dir = self.dir / "sbin-sudo"
        self.sudo_rule_path = self.dir / "sudoers.json"
        self.sudo_log_path = self.dir / "log" / "sudo.jsonl"
        # The docker/podman/crictl/scontrol/scancel/systemctl stand-ins (``runtimes=True``).
        self.runtimes = False
        self.runtime_dir = self.dir / "runtime-bin"
        self.runtime_names: tuple[str, ...] = ()  # what the inventory lists (real or stand-ins)
        self.port = 0
        self.kernlog_dir = self.dir / "kernlog-bin"  # journalctl, dmesg (gpusim.kernlog)
        self.kernel = KernelLog(self.state_dir, [])
        self._initial_delay = release_delay_s
        self._seq = itertools.count(1)  # next() is atomic: control threads may spawn at once

    # ---- layout ---------------------------------------------------------------------------

    def create(self, lib_dir: Path, python: str) -> None:
        """Create the node's directories, device files, state and nvidia-smi launcher."""
        node_layout.make_tree(self.dir, self.minors)
        gpus = node_layout.gpu_records(self.name, self.model, self.memory_mib, self.minors)
        node_layout.write_driver(self.driver_dir, self.pci_dir, gpus)
        state = simstate.new_state(self.name, gpus, self.dev_prefix, self._initial_delay)
        node_layout.init_state(self.state_dir, state)
        self.kernel = KernelLog(self.state_dir, [str(g["bus_id"]) for g in gpus])
        node_layout.write_kernlog(self.kernlog_dir, python, lib_dir, self.name, self.state_dir)
        node_layout.write_launcher(
            Path(self.nvidia_smi),
            python,
            lib_dir,
            f"nvidia-smi of the simulated node {self.name}.",
            "nvidia_smi",
            f"sys.argv[1:], {str(self.state_dir)!r}",
        )

    def create_sudo(self, lib_dir: Path, python: str, rule: dict[str, Any]) -> None:
        """Install the sudo stand-in: ``sbin-sudo/sudo``, this node's rule file and its log.

        ``rule`` is ``gpusim.sudoers.parse_sudoers`` of the README's block; its device and
        nvidia-smi paths are rewritten to this node's.
        """
        # The runtime programs always point into the node (installed or not): a sudo node never
        # reaches this machine's own docker or systemctl.
        mine = node_rule(
            rule,
            self.name,
            self.dev_prefix,
            self.nvidia_smi,
            str(self.sudo_log_path),
            programs=self.runtime_programs(),
        )
        node_layout.write_sudo_files(self.sudo_dir, self.sudo_rule_path, self.sudo_log_path, mine)
        doc = f"sudo of the simulated node {self.name}: only the rule commands, with -n."
        node_layout.write_launcher(
            self.sudo_dir / "sudo",
            python,
            lib_dir,
            doc,
            "sudo",
            f"sys.argv[1:], {str(self.sudo_rule_path)!r}",
        )
        self.sudo = True

    def runtime_programs(self) -> dict[str, str]:
        """Return where this node's runtime stand-ins are (or would be): name -> path."""
        return {prog: str(self.runtime_dir / prog) for prog in runtimes.PROGRAMS}

    def create_runtimes(self, lib_dir: Path, python: str) -> None:
        """Install the stand-ins ``docker``, ``podman``, ``crictl``, ``scontrol``, ``scancel``
        and ``systemctl`` in ``runtime-bin/`` (see ``gpusim.runtimes``)."""
        self.runtime_dir.mkdir(exist_ok=True)
        os.chmod(self.runtime_dir, 0o755)
        for prog, path in self.runtime_programs().items():
            doc = f"{prog} of the simulated node {self.name} (gpusim.runtimes)."
            args = f"{prog!r}, sys.argv[1:], {str(self.state_dir)!r}"
            node_layout.write_launcher(Path(path), python, lib_dir, doc, "runtimes", args)
        self.runtimes = True

    def set_runtime_delay(self, seconds: float) -> None:
        """Make every runtime stand-in of this node sleep ``seconds`` before it answers."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise SimUsageError(f"runtime delay must be a number of seconds >= 0, not {seconds!r}")
        runtime_registry.set_delay(str(self.state_dir), float(seconds))

    def registry(self) -> list[dict[str, Any]]:
        """Return the node's container/job registry (``gpusim.runtimes`` documents it)."""
        with simstate.locked(str(self.state_dir)):
            entries: list[dict[str, Any]] = runtime_registry.load(str(self.state_dir))["entries"]
        return entries

    def sudo_log(self) -> list[dict[str, Any]]:
        """Return every call of this node's sudo stand-in, oldest first ([] without one).

        Each is ``{"argv", "command", "allowed", "verdict", "node", "pid", "uid", "time"}``
        (+ ``"reason"`` when refused): ``argv`` as sudo got it, ``command`` the resolved
        command line it checked (None if it never got that far), ``verdict`` one of ``run``,
        ``denied``, ``not-found``, ``no-n``, ``usage``.
        """
        return read_log(str(self.sudo_log_path))

    def device(self, gpu: int) -> str:
        """Return the device file of GPU ``gpu`` (index): the one named by its minor."""
        return f"{self.dev_prefix}{self.minors[gpu]}"

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
        ``{pid}`` by its pid (see ``gpusim.workload``); it may hold newlines and NULs.
        ``exe_path``: run through a copy of the interpreter at this path in the node's folder
        (``daemon_exe``): ``/proc/PID/exe`` shows it. ``user``: also one of ``gpusim.people``.

        ``cgroup`` (``cgroups.KINDS``): the process (a ``respawn``'s supervisor) goes into a fresh
        real cgroup of that shape first (``gpusim.cgroups``; more: ``spec.make_spec``), recorded
        for the runtime stand-ins; ``SimError`` when cgroups cannot be made here.
        """
        spec = make_spec(
            cgroup,
            container_name=container_name,
            image=image,
            labels=labels,
            restart=restart,
            pod=pod,
            job_name=job_name,
            job_user=job_user,
        )
        req = check_request(
            self.name,
            self.gpus,
            self.memory_mib,
            gpu=gpu,
            mib=mib,
            behaviour=behaviour,
            user=user,
            name=name,
            util_pct=util_pct,
            slow_exit_s=slow_exit_s,
            forge=forge,
            spec=spec,
            people=self.fleet.people,
        )
        self._check_name_free(spec)
        return self._launch(req, exe_path)

    def _check_name_free(self, spec: Spec | None) -> None:
        """Refuse a docker or podman container name that one of that runtime's containers on
        this node has, as the daemon does ("Conflict. The container name ... is in use")."""
        if spec is not None and spec.kind in ("docker", "podman") and spec.name is not None:
            taken = {e["name"] for e in self.registry() if e["kind"] == spec.kind}
            if spec.name in taken:
                raise SimUsageError(
                    f'{self.name}: the container name "{spec.name}" is already in use'
                )

    def _launch(self, req: Request, exe_path: str | None) -> Workload:
        """Start a checked request: in its cgroup, if any; record it; return it once ready."""
        pw, spec, respawn = req.pw, req.spec, req.behaviour == "respawn"
        exe = self._exe(req.name) if exe_path is None else self._interpreter_copy(exe_path)
        argv = req.argv(self.fleet.lib_dir, self.state_dir, exe)
        placements = self.fleet.placements
        placement = None if spec is None else placements.place(self.name, spec.kind, pw.pw_uid)
        log_path = self.dir / "log" / f"workload-{next(self._seq)}.log"
        try:
            pid, ticks, proc = start_process(
                self.fleet, self.name, self.dir, log_path, argv, exe, pw, respawn, placement
            )
        except BaseException:
            if placement is not None:
                placements.unplace(self.name, placement)
            raise
        self.fleet.watch(str(self.state_dir), pid, ticks)
        w = Workload(
            node=self.name,
            pid=pid,
            start_ticks=ticks,
            gpu=req.gpu,
            mib=0 if req.behaviour in GPULESS else req.mib,
            behaviour=req.behaviour,
            user=pw.pw_name,
            name=req.name,
            supervisor_pid=proc.pid if respawn else None,
            supervisor_start_ticks=simstate.start_ticks(proc.pid) if respawn else None,
            _node=self,
        )
        if spec is not None and placement is not None:
            runtime_registry.register(str(self.state_dir), identify(w, spec, placement, pw))
        return w

    def adopt(self, pid: int, gpu: int, mib: int, util_pct: int = 50) -> Workload:
        """Make ``pid``, a process the fleet did not start (a real container's or Slurm job's)
        that holds GPU ``gpu``'s device file open, a compute app using ``mib`` there.

        The driver watches it and frees its memory ``release_delay_s`` after it dies, as for a
        spawned workload; the fleet never signals it (see ``gpusim.adopt``).
        """
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < self.gpus:
            raise SimUsageError(f"{self.name}: no GPU {gpu!r}")
        if isinstance(mib, int) and mib > self.memory_mib:
            raise SimUsageError(f"{self.name}: {mib} MiB is more than a GPU holds")
        rec = adopt.record(self.name, pid, gpu, mib, util_pct, self.device(gpu))
        ticks, user, name = rec["start_ticks"], rec["user"], rec["name"]
        with simstate.transaction(str(self.state_dir)) as state:
            if any((a["pid"], a["start_ticks"]) == (pid, ticks) for a in state["allocs"]):
                raise SimUsageError(f"{self.name}: pid {pid} holds a GPU of this node already")
            state["allocs"].append(rec)
        self.fleet.watch(str(self.state_dir), pid, ticks)
        return Workload(self.name, pid, ticks, gpu, mib, adopt.BEHAVIOUR, user, name, _node=self)

    def daemon_exe(self, name: str) -> str:
        """Return ``<node dir>/sbin/<name>``, a copy of the interpreter, made on first use."""
        node_layout.check_exe_name(name, "executable")
        sbin = Path(os.path.realpath(self.dir)) / "sbin"
        sbin.mkdir(exist_ok=True)
        os.chmod(sbin, 0o755)  # workloads of other users exec from it
        return self._interpreter_copy(str(sbin / name))

    def _interpreter_copy(self, path: str) -> str:
        """Make ``path`` (inside the node's directory) a copy of the interpreter; return it."""
        return node_layout.interpreter_copy(self.name, self.dir, self.fleet.python_real, path)

    def _exe(self, name: str) -> str:
        """Return a link named ``name`` to the interpreter: exec'd through it, comm is ``name``."""
        return node_layout.exe_link(self.dir, name, self.fleet.python_real)

    # ---- faults, overrides, state ---------------------------------------------------------

    def set_fault(self, kind: str | None, **params: Any) -> None:
        """Set the nvidia-smi fault: hang, slow (delay_s), missing, garbled, driver-error,
        inforom (exit 14 with the warning), lost (gpu, style: GPU ``gpu`` fell off the bus),
        stuck (hold_s: every call hangs and leaves a copy no kill reaches), None. Clearing the
        fault ends the stuck copies.
        """
        try:
            fault = smi_faults.fault_record(kind, params, self.gpus)
        except ValueError as exc:
            raise SimUsageError(str(exc)) from None
        if kind is None:
            self.unstick()
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
            raise SimUsageError(f"{self.name}: no GPU {gpu}")
        with simstate.transaction(str(self.state_dir)) as state:
            state["gpus"][gpu]["mig"] = "Enabled" if enabled else "Disabled"

    def override(self, query: str, fld: str, text: str | None, gpu: int | None = None) -> None:
        """Make nvidia-smi print ``text`` (e.g. ``[N/A]``) for a field; None restores the value.

        ``query`` is ``"gpu"`` (``--query-gpu``; ``gpu=None`` means every GPU) or ``"apps"``
        (``--query-compute-apps``, every row).
        """
        try:
            canon = canonical_field(query, fld)
        except ValueError as exc:
            raise SimUsageError(str(exc)) from None
        if query == "gpu" and gpu is not None and not 0 <= gpu < self.gpus:
            raise SimUsageError(f"{self.name}: no GPU {gpu}")
        slot = ("*" if gpu is None else str(gpu)) if query == "gpu" else ""
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
            raise SimUsageError(f"release delay must be a number of seconds >= 0, not {value!r}")
        with simstate.transaction(str(self.state_dir)) as state:
            state["release_delay_s"] = float(value)

    def state(self) -> dict[str, Any]:
        """Return the node's GPUs, allocations and fault as plain data."""
        with simstate.transaction(str(self.state_dir)) as st:
            return {"node": self.name, "port": self.port, **simstate.report(st, time.time())}

    # ---- servers --------------------------------------------------------------------------

    def stop_server(self) -> None:
        """Stop this node's SSH server (and drop its connections): the port refuses."""
        self.fleet.stop_server(self.name)

    def start_server(self) -> None:
        """Start this node's SSH server again on the same port."""
        self.fleet.start_server(self.name)

    def hang_server(self) -> None:
        """Replace the SSH server by a listener that accepts TCP and never speaks SSH."""
        self.fleet.hang_server(self.name)

    def ssh_argv(self, *remote: str) -> list[str]:
        """Return an OpenSSH client command line that runs ``remote`` (joined) on this node."""
        f = self.fleet
        return client_argv(f.client_key, f.known_hosts, f.user, self.port, shlex.join(remote))

    def kill_workloads(self, timeout_s: float = 5.0) -> int:
        """SIGKILL every live workload of this node (supervisors first); return how many."""
        killed = self.fleet.kill_supervisors(self.name)
        for pid, ticks in self.live_pids():
            if simstate.signal_if(pid, ticks, signal.SIGKILL):
                killed += 1
        deadline = time.monotonic() + timeout_s
        while self.live_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        return killed

    def clear(self) -> None:
        """Kill the workloads and forget them, clear the fault, the overrides and the sudo log;
        remove the workloads' cgroups and empty the registry (and the stand-ins' delay)."""
        self.kill_workloads()
        self.fleet.placements.release(self.name)
        runtime_registry.clear(str(self.state_dir))
        self.set_fault(None)
        self.kernel.clear()
        if self.sudo:
            self.sudo_log_path.write_bytes(b"")
        with simstate.transaction(str(self.state_dir)) as state:
            state["allocs"] = []
            state["overrides"] = {"gpu": {}, "apps": {}}
            state.pop("health", None)  # gpusim.health_faults (a vanished GPU's too)
            node_layout.write_pci(self.pci_dir, state["gpus"])  # one gone from PCI comes back

    def live_pids(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of every live process this node started (an adopted
        process is its runtime's: left out)."""
        with simstate.locked(str(self.state_dir)):
            st = simstate.load(str(self.state_dir))
        return [
            (a["pid"], a["start_ticks"])
            for a in st["allocs"]
            if not a.get("adopted") and simstate.is_alive(a["pid"], a["start_ticks"])
        ]

    def stuck_smi(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of the stuck copies (fault ``stuck``) still there."""
        return smi_faults.stuck_copies(str(self.state_dir))

    def unstick(self) -> None:
        """End the stuck copies (by pid and start time) and forget them."""
        smi_faults.end_stuck(str(self.state_dir))

    def hung_smi(self) -> list[tuple[int, int]]:
        """Return ``(pid, start ticks)`` of the stand-in's calls that hang now."""
        return smi_faults.hung_calls(str(self.state_dir))
