"""The node probe: ONE remote exec that gathers everything a ``NodeSnapshot`` needs.

The script runs the two queries under a time limit, ``fuser -v`` on exactly the device files
found (never a glob), then reads ``/proc`` for every PID on a GPU's device file. A probe past its
budget says so: the node's answer is unknown (``ProbeError``).

The output is parsed strictly: sections in order and once each, each PID once, every escaped
field well formed. Anything else is a ``ParseError`` for the node, never a different table. A
PID that vanishes mid-probe is simply absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from gpubot.core.models import (
    CommandResult,
    ComputeApp,
    DeviceHolder,
    GpuInfo,
    GpuProcess,
    NodeConfig,
    NodeSnapshot,
    ProcInfo,
)
from gpubot.core.probe.fields import NUM, float_or_none
from gpubot.core.probe.holders import NOT_CHECKED, Holders, memory_adds_up
from gpubot.core.probe.nvsmi import normal_bus_id, parse_apps_answer, parse_gpu_answer
from gpubot.core.probe.script import PROBE_SCRIPT, PROC_SCRIPT
from gpubot.core.probe.sections import PROBE_GRAMMAR, PROC_GRAMMAR, Sections
from gpubot.core.reset.protect import Protection, is_protected
from gpubot.errors import ConfigError, ParseError, ProbeError, SmiFailed

_MISSING = {
    "no-timeout": "timeout (coreutils) not found on the node",
    "no-fuser": "fuser (psmisc) not found on the node",
    "no-sudo": "sudo not found on the node (its inventory entry says sudo = true)",
    "old-bash": "the probe needs bash 4.4 or later on the node",
}


@dataclass(frozen=True)
class NvmlKnown:
    """What NVML already told of the local box, so that the probe skips nvidia-smi."""

    gpu_indices: Sequence[int]
    pids: Sequence[int] = ()
    minors: Sequence[int] = ()


def probe_argv(
    node: NodeConfig,
    *,
    smi_timeout_s: float,
    gpu_indices: Sequence[int] | None = None,
    nvml: NvmlKnown | None = None,
    budget_s: float | None = None,
    holders: Holders = Holders.ALWAYS,
    state_dir: str | None = None,
) -> list[str]:
    """Return the argv of the one-exec probe of ``node``.

    ``budget_s``: the script's own budget (default: the status command's timeout less one
    second); past it the answer is unknown. ``state_dir``: where the queries record themselves
    for the stuck-query check (default ``/run/user/UID``; "": walk ``/proc`` instead).
    """
    if not node.dev_prefix.startswith("/"):
        raise ConfigError(f"node {node.name}: dev_prefix must be an absolute path")
    if state_dir and not state_dir.startswith("/"):
        raise ValueError(f"state_dir must be an absolute path or empty, got {state_dir!r}")
    if smi_timeout_s <= 0:
        raise ValueError(f"smi_timeout_s must be > 0, got {smi_timeout_s!r}")
    budget = 2 * smi_timeout_s + 1 if budget_s is None else budget_s
    if budget <= 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
    if nvml is not None:
        gpu_indices = nvml.gpu_indices
    pids, minors = (nvml.pids, nvml.minors) if nvml is not None else ((), ())
    idx = "" if gpu_indices is None else ",".join(str(_nonneg(i)) for i in gpu_indices)
    return [
        "bash",
        "-c",
        PROBE_SCRIPT,
        "gpubot-probe",
        node.nvidia_smi,
        node.dev_prefix,
        f"{smi_timeout_s:.3f}".rstrip("0").rstrip("."),
        "sudo" if node.sudo else "-",
        "nvml" if nvml is not None else "smi",
        idx,
        node.driver_dir,
        ",".join(str(_nonneg(m)) for m in minors),
        str(max(1, round(budget * 1000))),
        "auto" if holders is Holders.IF_UNEXPLAINED and nvml is None else "always",
        "-" if state_dir is None else state_dir,
        *(str(_nonneg(p)) for p in pids),
    ]


def proc_argv(pids: Sequence[int]) -> list[str]:
    """Return the argv that reads ``/proc`` for ``pids``; it needs no privilege, never sudo."""
    return ["bash", "-c", PROC_SCRIPT, "gpubot-procs", *(str(_nonneg(p)) for p in pids)]


def parse_procs(text: str, pids: Sequence[int]) -> dict[int, ProcInfo]:
    """Parse the output of ``proc_argv(pids)``; a PID that vanished is absent; raise ParseError."""
    return Sections.parse(text, PROC_GRAMMAR, "process listing").procs(pids)


def parse_probe(
    node: NodeConfig,
    result: CommandResult,
    taken_at: float,
    nvml: tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]] | None = None,
    protection: Protection | None = None,
) -> NodeSnapshot:
    """Build the snapshot of ``node`` from the probe's result (and NVML's tables when given)."""
    s = Sections.parse(result.stdout, PROBE_GRAMMAR, "probe output", result=result, node=node.name)
    timeout_s, asked_all = _preamble(s, node)
    gpus, apps, notes, lost = _tables(s, node, nvml, timeout_s)
    minors = s.minors()
    gpus = _with_minors(sorted(gpus, key=lambda g: g.index), minors)
    checked = s.fuser_ran()
    if not checked and (nvml is not None or not memory_adds_up(gpus, apps)):
        raise ParseError("probe output (fuser skipped on memory that does not add up)", "")
    holders, unseen = s.fuser(node)
    # A GPU's device file is named only through its minor (never index == minor).
    gpu_paths = {node.device(g.minor): g.index for g in gpus if g.minor is not None}
    other_gpus = {node.device(m) for m in minors.values() if m is not None}
    ctl_paths = {f"{node.dev_prefix}ctl", f"{node.dev_prefix}-uvm"}
    on_gpu, ctl_pids = _sort_holders(holders, gpu_paths, ctl_paths, other_gpus)
    # The script reads /proc for the apps' PIDs, then those of the GPUs' device files' holders, in
    # that order: so must the output. A holder of only the control files is counted, never read.
    read = [h.pid for h in holders if h.path not in ctl_paths]
    procs = s.procs([a.pid for a in apps] + read)
    strict = nvml is None and asked_all  # every GPU was asked for: each app must be on one
    visible = _on_gpus(gpus, apps, on_gpu, procs, strict=strict)
    listed = {pid for pid, _ in visible} | {h.pid for h in holders if h.path in other_gpus}
    first = {h.pid: h for h in reversed(holders) if h.path in ctl_paths}
    ctl_only = tuple(first[pid] for pid in sorted(ctl_pids - listed))  # fuser's rows, unread
    rule = protection or Protection()
    processes = tuple(
        sorted(
            (_marked(p, is_protected(p, rule)) for p in visible.values()),
            key=lambda p: (p.gpu_index, p.pid),
        )
    )
    hidepid, uid = s.view()
    notes += _partial_view(node, unseen, hidepid, uid) + (() if checked else (NOT_CHECKED,))
    return NodeSnapshot(
        node=node.name,
        taken_at=taken_at,
        gpus=tuple(gpus),
        processes=processes,
        ctl_only=ctl_only,
        notes=notes,
        lost=lost,
        unseen=unseen,
        hidepid=hidepid,
        holders_checked=checked,
    )


def _preamble(s: Sections, node: NodeConfig) -> tuple[float | None, bool]:
    """Raise if the probe stopped early; return nvidia-smi's timeout and whether every GPU was
    asked for."""
    fatal = s.get("fatal")
    if fatal is not None:
        missing = fatal[0][0] if fatal[0] else "?"
        raise ProbeError(node.name, _MISSING.get(missing, f"probe stopped: {missing}"))
    probe_args = s.args("probe", 2)
    stuck = s.get("stuck")
    if stuck is not None:
        raise _stuck(node.name, stuck[1])
    return float_or_none(probe_args[0]), probe_args[1] == "-"


def _tables(
    s: Sections,
    node: NodeConfig,
    nvml: tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]] | None,
    timeout_s: float | None,
) -> tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...], tuple[str, ...], tuple[str, ...]]:
    """Return the GPU and app tables, nvidia-smi's notes and the lost GPUs' bus ids."""
    if nvml is not None:
        if "gpus" in s.kinds:
            raise ParseError("probe output (nvidia-smi ran on an NVML node)", "")
        return nvml[0], nvml[1], (), ()
    if "gpus" not in s.kinds:
        raise ParseError("probe output (no gpus section)", "")
    gpus, said = parse_gpu_answer(node.name, *s.smi_answer("gpus"), timeout_s=timeout_s)
    apps = parse_apps_answer(node.name, *s.smi_answer("apps"), timeout_s=timeout_s)
    lost = tuple(bus or "?" for index, bus, _ in said.lost if index is None)
    return tuple(gpus), tuple(apps), said.lines(), lost


def _sort_holders(
    holders: Sequence[DeviceHolder],
    gpu_paths: dict[str, int],
    ctl_paths: set[str],
    others: set[str],
) -> tuple[dict[tuple[int, int], DeviceHolder], set[int]]:
    """Return the holders of each probed GPU by (pid, GPU) and the PIDs holding the control
    files; a file the probe did not ask about is a ParseError."""
    on_gpu: dict[tuple[int, int], DeviceHolder] = {}
    ctl_pids: set[int] = set()
    for h in holders:
        if h.path in gpu_paths:
            on_gpu.setdefault((h.pid, gpu_paths[h.path]), h)
        elif h.path in ctl_paths:
            ctl_pids.add(h.pid)
        elif h.path not in others:
            raise ParseError("fuser line (a file the probe did not ask about)", h.path)
    return on_gpu, ctl_pids


def _on_gpus(
    gpus: Sequence[GpuInfo],
    apps: Sequence[ComputeApp],
    on_gpu: dict[tuple[int, int], DeviceHolder],
    procs: dict[int, ProcInfo],
    *,
    strict: bool,
) -> dict[tuple[int, int], GpuProcess]:
    """Return the processes on each GPU by (pid, GPU): nvidia-smi's, then hidden holders."""
    by_uuid = {g.uuid: g.index for g in gpus}
    visible: dict[tuple[int, int], GpuProcess] = {}
    for app in apps:
        if app.gpu_uuid not in by_uuid:
            if strict:
                raise ParseError("compute app on a GPU nvidia-smi did not list", app.gpu_uuid)
            continue
        key = (app.pid, by_uuid[app.gpu_uuid])
        prev = visible.get(key)
        mem = app.used_memory_mib
        if prev is not None:  # one process, several contexts on one GPU: add them up
            mem = (
                None if mem is None or prev.used_memory_mib is None else mem + prev.used_memory_mib
            )
        visible[key] = _gpu_process(app.pid, key[1], mem, True, key in on_gpu, procs.get(app.pid))
    # A hidden holder is a process nvidia-smi lists on NO GPU (another PID namespace, a leak).
    # CUDA opens every visible GPU's device file, so a job nvidia-smi lists on GPU 0 also holds
    # nvidia1..N: that does not put it on those GPUs.
    listed_by_smi = {a.pid for a in apps}
    for key, h in on_gpu.items():
        if key not in visible and h.pid not in listed_by_smi:
            visible[key] = _gpu_process(
                h.pid, key[1], None, False, True, procs.get(h.pid), fallback_user=h.user
            )
    return visible


def _partial_view(
    node: NodeConfig, unseen: int, hidepid: str | None, uid: int | None
) -> tuple[str, ...]:
    """Say what this probe could not see: other users' open files, hidden /proc entries."""
    notes: tuple[str, ...] = ()
    if uid not in (None, 0) and not node.sudo:  # fuser skips what it may not look into, silently
        notes += (
            f"partial view: gpubot reads this node as uid {uid}, without sudo: fuser cannot see "
            "other users' open files, so a holder of a GPU's device file may be missed",
        )
    elif unseen:
        notes += (
            f"partial view: fuser could not look into {unseen} other process(es): a holder of a "
            "GPU's device file may be missed",
        )
    if hidepid:
        notes += (
            f"partial view: /proc is mounted hidepid={hidepid}: other users' processes are "
            "hidden from gpubot, and nvidia-smi's may show as gone",
        )
    return notes


def _stuck(node: str, body: str) -> SmiFailed:
    """Say that nvidia-smi hangs in the kernel (the probe started no other); raise ParseError."""
    rows = [line.split(" ") for line in body.split("\n") if line]
    if not rows or any(
        len(r) != 3 or not NUM.fullmatch(r[0]) or not NUM.fullmatch(r[2]) or len(r[1]) != 1
        for r in rows
    ):
        raise ParseError("probe output (stuck section)", body[:200])
    pid, state, age = rows[0]
    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
    return SmiFailed(
        node,
        f"driver hung: nvidia-smi pid {pid} stuck for {age}s (state {state}){more}; no new query "
        "started: the node needs a GPU reset or a reboot",
    )


def _marked(p: GpuProcess, system: bool) -> GpuProcess:
    """Return ``p`` marked a protected daemon or not (itself when it already is: no copy)."""
    return p if p.system == system else replace(p, system=system)


def _with_minors(gpus: Sequence[GpuInfo], by_bus: dict[str, int | None]) -> tuple[GpuInfo, ...]:
    """Give each GPU its device minor: NVML's where it said, else the driver's for its bus id."""
    out = []
    for g in gpus:
        minor = g.minor
        if minor is None and g.bus_id is not None:
            minor = by_bus.get(normal_bus_id(g.bus_id) or "")
        out.append(g if minor == g.minor else replace(g, minor=minor))
    minors = [g.minor for g in out if g.minor is not None]
    if len(set(minors)) != len(minors):
        raise ParseError("device minors (two GPUs on one device file)", str(sorted(minors)))
    return tuple(out)


# A row takes every field its process's /proc read has under the same name (the pid aside).
_FROM_PROC = {f.name for f in fields(ProcInfo)} & {f.name for f in fields(GpuProcess)} - {"pid"}


def _gpu_process(
    pid: int,
    gpu: int,
    mem: int | None,
    visible: bool,
    holds: bool,
    info: ProcInfo | None,
    fallback_user: str | None = None,
) -> GpuProcess:
    if info is None:
        return GpuProcess(pid, gpu, mem, "?", visible, holds, user=fallback_user)
    return GpuProcess(
        pid, gpu, mem, info.comm, visible, holds, **{k: getattr(info, k) for k in _FROM_PROC}
    )


def _nonneg(i: int) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"expected a non-negative integer, got {i!r}")
    return i
