"""Flags shown beside GPUs and processes in every table (terminal, console, Slack)."""

from __future__ import annotations

from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.slurm import alloc
from gpubot.core.text import cut
from gpubot.core.workload import named, short_name

NO_PROCESS_MEMORY_MIB = 256  # below this, memory with no process is the driver's own


def process_flags(p: GpuProcess) -> tuple[str, ...]:
    """Return the flags of one process on a GPU."""
    if p.system:  # a protected daemon holds every GPU by design: not a job, not hidden
        return ("system",)
    flags: list[str] = []
    if p.hidden:
        flags.append("hidden")
    if not p.exists:
        flags.append("gone")  # nvidia-smi lists it, /proc does not
    if p.state == "D":
        flags.append("D-state")
    if p.state == "Z":
        flags.append("zombie")
    return tuple(flags)


def gpu_flags(gpu: GpuInfo, procs: tuple[GpuProcess, ...]) -> tuple[str, ...]:
    """Return the flags of one GPU given the processes on it."""
    flags: list[str] = list(gpu.flags)  # lost, requires-reset, warning ...: nvidia-smi's own say
    if gpu.health is not None:  # the last sweep's health fields (core.health.state)
        flags += gpu.health.flags()
    used = gpu.memory_used_mib
    jobs = [p for p in procs if not p.system]  # a daemon holding the GPU does not hide a leak
    if used is not None and used > NO_PROCESS_MEMORY_MIB and not any(p.exists for p in jobs):
        flags.append("no-process-memory")
    if used is None and "lost" not in flags:
        flags.append("memory-unknown")
    if gpu.minor is None:  # holders of its device file cannot be told: never guessed from index
        flags.append("device-file-unknown")
    for p in jobs:
        for f in process_flags(p):
            if f not in flags:
                flags.append(f)
    return tuple(flags)


def flags_of(snap: NodeSnapshot, g: GpuInfo) -> tuple[str, ...]:
    """Return the flags of ``g``, worked out once a snapshot: a ``status all`` asks for them in
    its counts, tables, flagged lines and ``--json``."""
    known = snap.flag_memo.get(g.index)
    if known is not None and known[0] is g:
        return known[1]
    flags = gpu_flags(g, snap.on_gpu(g.index)) + alloc.flags(snap, g)
    snap.flag_memo[g.index] = (g, flags)
    return flags


def owner_label(p: GpuProcess) -> str:
    """Return whose job a process is: its workload's owner, else its own user."""
    w = p.workload
    return (w.owner if w is not None and w.owner else p.user) or "?"


def workload_label(p: GpuProcess, n: int = 24) -> str:
    """Return the short workload column of a process (``docker:train-llama ``), or ""."""
    w = p.workload
    if w is None or not named(w):
        return ""
    short = short_name(w)
    return cut(short, n) + " "


def node_notes(snap: NodeSnapshot) -> tuple[str, ...]:
    """Return every note of a node's answer: what the node said, then what gpubot cannot see.

    Older drivers without a ``Device Minor`` line, and no NVML, leave gpubot unable to tell
    which ``/dev/nvidiaN`` is the GPU's: the index is never taken for the minor.
    """
    said = (*snap.notes, *alloc.notes(snap))
    blind = [g.index for g in snap.gpus if g.minor is None]
    if not blind:
        return said
    which = f"GPU {blind[0]}" if len(blind) == 1 else f"GPUs {', '.join(map(str, blind))}"
    return (
        *said,
        f"device file unknown for {which}: the driver does not say which /dev/nvidiaN is "
        f"{'its' if len(blind) == 1 else 'theirs'} (no Device Minor line), so gpubot cannot see "
        "who holds that device file: a holder nvidia-smi does not list (hidden, another PID "
        "namespace, leaked memory) is missed, and a reset cannot find or wait for holders by "
        "device file, nor call the GPU free on that evidence",
    )
