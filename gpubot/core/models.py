"""Snapshots and value types shared by every layer.

Snapshots are frozen and built only by parsers; an unknown value is ``None``, never ``0`` or "N/A".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from gpubot.core.health.state import GpuHealth
from gpubot.core.slurm import SlurmView
from gpubot.core.workload import Workload


@dataclass(frozen=True)
class CommandResult:
    """The result of one command, shaped like ``subprocess.CompletedProcess``."""

    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class NodeConfig:
    """One box of the inventory and how to reach it."""

    name: str
    host: str  # "local" means the box gpubot runs on (NVML, no SSH)
    port: int = 22
    user: str | None = None
    key: str | None = None
    # The device files: minor m is {dev_prefix}{m}; also {dev_prefix}ctl, {dev_prefix}-uvm.
    dev_prefix: str = "/dev/nvidia"
    sudo: bool = False  # prefix privileged commands with ``sudo -n``
    groups: tuple[str, ...] = ()
    nvidia_smi: str = "nvidia-smi"  # the command to run; the simulated fleet points it elsewhere
    # The driver's /proc folder: gpus/<bus id>/information says each GPU's "Device Minor".
    driver_dir: str = "/proc/driver/nvidia"
    # The fabric manager's pid file (NVSwitch boxes; the sweep's health checks read it).
    fabricmanager_pid: str = "/run/nvidia-fabricmanager/nv-fabricmanager.pid"
    # Runtimes gpubot may ask for workload names (docker, podman, slurm, crictl): the node's own
    # list and its groups' (``[groups.NAME] runtimes``). Empty: attribution from cgroups only.
    runtimes: tuple[str, ...] = ()
    # The scheduler that owns the node's GPUs ("slurm"), the node's or its groups'; None: none.
    scheduler: str | None = None
    slurm_node: str | None = None  # the node's NodeName in Slurm, when it is not ``name``
    # How many GPUs the node has (the node's or its groups' ``gpus``); None: the most the sweeps
    # have seen since gpubot started. Fewer is a ``gpu-vanished`` finding.
    gpus: int | None = None
    # The kernel's PCI devices (sysfs): each GPU's vendor and class, read by the health exec.
    pci_dir: str = "/sys/bus/pci/devices"
    # Where a fleet summary reads the node: "ssh" (its probe) or "prometheus" (its groups'
    # ``telemetry``: dcgm-exporter's series, ``core.telemetry``). Holders and actions: always SSH.
    telemetry: str = "ssh"

    @property
    def slurm_name(self) -> str:
        """Return the node's NodeName in Slurm."""
        return self.slurm_node or self.name

    def device(self, minor: int) -> str:
        """Return the device file of minor ``minor``; a GPU's index is NOT its minor."""
        return f"{self.dev_prefix}{minor}"


@dataclass(frozen=True)
class GpuInfo:
    """One row of ``nvidia-smi --query-gpu``."""

    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    bus_id: str | None = None  # PCI bus id as nvidia-smi prints it ("00000000:18:00.0")
    minor: int | None = None  # its device file's minor number; None: unknown (never assumed)
    flags: tuple[str, ...] = ()  # what nvidia-smi said instead of values: lost, requires-reset ...
    health: GpuHealth | None = None  # the sweep's health fields (core.health.state); None: not read


@dataclass(frozen=True)
class ComputeApp:
    """One row of ``nvidia-smi --query-compute-apps``."""

    pid: int
    gpu_uuid: str
    used_memory_mib: int | None


@dataclass(frozen=True)
class DeviceHolder:
    """One process holding a device file, as ``fuser -v`` reports it."""

    path: str
    pid: int
    user: str
    access: str
    command: str


@dataclass(frozen=True)
class ProcInfo:
    """What ``/proc/PID`` says of one process (text the process controls is marked so)."""

    pid: int
    ppid: int
    user: str  # the effective uid's name on the node (the uid as digits if it has none)
    state: str  # one letter: R S D Z T t X I
    start_ticks: int  # field 22 of /proc/PID/stat: identity against PID reuse
    elapsed_s: int | None
    command: str  # the process's own say: argv joined by spaces, or [comm]
    wchan: str | None = None  # kernel function it sleeps in (/proc/PID/wchan), if known
    cgroup: str | None = None  # the whole /proc/PID/cgroup text (which container/job)
    uid: int | None = None  # effective uid, from /proc/PID/status (a process cannot fake it)
    real_uid: int | None = None  # real uid: differs from ``uid`` for a setuid program
    exe: str | None = None  # /proc/PID/exe when gpubot may read it (own or root), else None
    comm: str = ""  # the process's own say: its name (15 bytes, may hold anything)
    argv0: str = ""  # the process's own say: argv[0]
    workload: Workload | None = None  # its container, job, pod, service or session (cgroup)


@dataclass(frozen=True)
class GpuProcess:
    """A process on one GPU: memory from nvidia-smi and/or a hold on the GPU's device file."""

    pid: int
    gpu_index: int
    used_memory_mib: int | None
    process_name: str  # comm from /proc (the process's own say); "?" when /proc lost it
    visible_to_nvidia_smi: bool
    holds_device_file: bool
    user: str | None = None
    ppid: int | None = None
    state: str | None = None
    start_ticks: int | None = None
    elapsed_s: int | None = None
    command: str | None = None
    wchan: str | None = None
    cgroup: str | None = None
    uid: int | None = None
    real_uid: int | None = None
    exe: str | None = None
    argv0: str | None = None
    system: bool = False  # a protected daemon (core.reset.protect): not a job, never signalled
    workload: Workload | None = None  # from its cgroup (+ names where the node allows lookups)

    @property
    def hidden(self) -> bool:
        """Holds the device file but nvidia-smi does not list it (another PID namespace)."""
        return self.holds_device_file and not self.visible_to_nvidia_smi

    @property
    def exists(self) -> bool:
        """Whether ``/proc`` still knows the process."""
        return self.start_ticks is not None


@dataclass(frozen=True)
class NodeSnapshot:
    """Everything one node said about its GPUs at one moment."""

    node: str
    taken_at: float  # unix time
    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...] = ()
    ctl_only: tuple[DeviceHolder, ...] = ()  # hold only nvidiactl/uvm: unread
    notes: tuple[str, ...] = ()  # what the node said beside its tables (a lost GPU, a warning)
    lost: tuple[str, ...] = ()  # bus ids ("?" unknown) of lost GPUs whose index nobody said
    unseen: int = 0  # processes whose open files fuser could not see (gpubot is not root)
    hidepid: str | None = None  # /proc's hidepid= option: other users' processes are hidden
    holders_checked: bool = True  # fuser asked (a status whose memory adds up skips it: a note)
    slurm: SlurmView | None = None  # what Slurm says of the node (a scheduler's node only)

    def gpu(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def on_gpu(self, index: int) -> tuple[GpuProcess, ...]:
        return self._by_gpu.get(index, ())

    @cached_property
    def flag_memo(self) -> dict[int, tuple[GpuInfo, tuple[str, ...]]]:
        """Each GPU's flags once worked out, by index (``core.flags.flags_of``)."""
        return {}

    @cached_property
    def _by_gpu(self) -> dict[int, tuple[GpuProcess, ...]]:
        """The processes by GPU, grouped once: a ``status all`` asks for them in its tables,
        counts, flags and ``--json`` document."""
        groups: dict[int, list[GpuProcess]] = {}
        for p in self.processes:
            groups.setdefault(p.gpu_index, []).append(p)
        return {i: tuple(ps) for i, ps in groups.items()}


class Outcome(StrEnum):
    """How a targeted GPU ended after a reset."""

    FREED = "freed"
    ORPHANED = "orphaned"
    STUCK = "stuck"
    RESPAWNED = "respawned"
    UNKNOWN = "unknown"


class ApprovalState(StrEnum):
    """Life of an approval for a forced kill."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    EXECUTED = "executed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"  # approved, but the bot stopped before recording the end
    WAITING = "waiting"  # approved, but it could not run yet (node busy, …): retried


class ActionStatus(StrEnum):
    """How an audited action ended (the outcome record's ``status``)."""

    FREED = "freed"  # every targeted GPU ended freed
    NOT_FREED = "not-freed"  # the action ran; some GPU did not end freed
    ERROR = "error"  # it stopped on an error (the result says which)
    REFUSED = "refused"  # nothing was done: gpubot refused the person or the request
    DONE = "done"  # a change of state (a Slurm drain or resume) was made and read back
    UNCHANGED = "unchanged"  # nothing to change: the node was so already (nothing sent)
    INCOMPLETE = "incomplete"  # no outcome is written: still running, or gpubot stopped
    UNKNOWN = "unknown"  # an outcome written without a status


class ResetStep(StrEnum):
    """Kinds of step a reset reports as it happens (``ResetEvent.kind``)."""

    PLANNED = "planned"
    SIGNAL = "signal"
    EXITED = "exited"
    VERIFYING = "verifying"
    GPU_OUTCOME = "gpu_outcome"
    PERSISTENCE = "persistence"
    GPU_RESET = "gpu_reset"
    STOP_WORKLOAD = "stop_workload"
    SENDING = "sending"  # a signal's or command's intent, written (fenced) just before it goes
    NODE_LOG = "node_log"  # the ``logger -t gpubot`` line of an action, and what logger said


class StopResult(StrEnum):
    """What became of a command that stops a respawning workload (``stop_workload`` steps)."""

    NOT_RUN = "not-run"  # the workload has processes the plan does not kill
    RUNNING = "running"  # audited before it runs
    DONE = "done"
    FAILED = "failed"
