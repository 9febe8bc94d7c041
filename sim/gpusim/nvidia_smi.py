"""The stand-in ``nvidia-smi`` of a simulated node: the real program's output, byte for byte.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and run by
``<node>/bin/nvidia-smi`` with the system Python. Supported, as the real program prints them:

- ``--query-gpu=index,uuid,name,memory.used,memory.total,memory.free,utilization.gpu,...``
  and ``--query-compute-apps=pid,gpu_uuid,used_memory,process_name,...`` with
  ``--format=csv[,noheader][,nounits]``: header ``memory.used [MiB]``, values ``1024 MiB``,
  unit fields bare with ``nounits``; ``[N/A]`` / ``[Not Supported]`` where overridden;
  no rows at all when no process runs (only the header line).
- ``-i/--id`` (index, UUID or bus id, comma list; ``No devices were found``, exit 6),
  ``-L``, the default table (with ``No running processes found``) and
  ``--gpu-reset -i N`` (refused with exit 255 while any process holds the GPU).
- Faults: ``hang``, ``slow`` (``delay_s``), ``missing`` (the fleet removes this file, so the
  shell answers 127), ``garbled`` (rows interleaved with foreign output), ``driver-error``
  (exit 9), ``inforom`` (``WARNING: infoROM is corrupted at gpu <bus>`` first, data, exit 14)
  and ``lost`` (GPU ``gpu`` fell off the bus: ``Unable to determine the device handle for
  GPU…: Unknown Error`` in one of the drivers' three shapes, the other GPUs listed, exit 15;
  nvidia-smi(1) RETURN VALUE names 14 and 15).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

from . import simstate
from .smi_faults import garble, hang, lost_line, stick
from .smi_health import ALIASES as HEALTH_ALIASES
from .smi_health import FIELDS as HEALTH_FIELDS
from .smi_health import applied, nvlink_status, query_sections, unknown_fields
from .smi_health import values as health_values

DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
NO_DEVICES = "No devices were found\n"
RESET_IN_USE = (
    "1 device is currently being used by one or more other processes (e.g., Fabric Manager, "
    "CUDA application, graphics application such as an X server, or a monitoring application "
    "such as another instance of nvidia-smi). Please first kill all processes using this "
    "device and all compute applications running in the system.\n"
)
RESET_IN_USE_MANY = (
    "{n} devices are currently being used by one or more other processes (e.g., Fabric "
    "Manager, CUDA application, graphics application such as an X server, or a monitoring "
    "application such as another instance of nvidia-smi). Please first kill all processes "
    "using these devices and all compute applications running in the system.\n"
)

# canonical name -> unit ("" for none); aliases map to canonical names.
GPU_FIELDS = {
    "index": "",
    "uuid": "",
    "name": "",
    "pci.bus_id": "",
    "mig.mode.current": "",
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "utilization.gpu": "%",
    "count": "",
    "driver_version": "",
}
GPU_FIELDS.update(HEALTH_FIELDS)  # ECC, row remapping, throttling, the fabric
GPU_ALIASES = {"gpu_uuid": "uuid", "gpu_name": "name", "gpu_bus_id": "pci.bus_id", **HEALTH_ALIASES}
APP_FIELDS = {
    "pid": "",
    "process_name": "",
    "gpu_uuid": "",
    "gpu_name": "",
    "gpu_bus_id": "",
    "used_gpu_memory": "MiB",
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def canonical_field(query: str, fld: str) -> str:
    """Return the canonical name of field ``fld`` of ``--query-gpu`` (``query`` "gpu") or of
    ``--query-compute-apps`` ("apps"), aliases resolved; ``ValueError`` for an unknown one."""
    if query not in ("gpu", "apps"):
        raise ValueError(f"query must be 'gpu' or 'apps', not {query!r}")
    gpu = query == "gpu"
    canon = (GPU_ALIASES if gpu else APP_ALIASES).get(fld, fld)
    if canon not in (GPU_FIELDS if gpu else APP_FIELDS):
        raise ValueError(f"unknown --query-{'gpu' if gpu else 'compute-apps'} field {fld!r}")
    return canon


class Usage(Exception):
    """Bad arguments: print ``text`` and exit with ``code``."""

    def __init__(self, text: str, code: int = 2) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


def main(argv: list[str], node_dir: str) -> int:
    """Run the stand-in with ``argv`` against the node at ``node_dir``; return the exit code."""
    try:
        opts = parse_args(argv)
    except Usage as exc:
        sys.stdout.write(exc.text)
        return exc.code
    with simstate.locked(node_dir):
        fault = dict(simstate.load(node_dir).get("fault") or {"kind": None})
    kind = fault.get("kind")
    if kind == "hang":
        hang(node_dir)
        return 1
    if kind == "stuck":  # in the kernel: one copy survives the caller's kill, like state D
        stick(node_dir, float(fault.get("hold_s", 60.0)))
        hang(node_dir)
        return 1
    if kind == "missing":  # the fleet renamed this file away; a racing call ends like the shell
        sys.stderr.write(f"bash: line 1: {sys.argv[0]}: No such file or directory\n")
        return 127
    if kind == "driver-error":
        sys.stdout.write(DRIVER_ERROR)
        return 9
    if kind == "slow":
        time.sleep(float(fault.get("delay_s", 5.0)))
    with simstate.transaction(node_dir) as state:
        now = time.time()
        simstate.refresh(state, now)
        try:
            if opts["mode"] in ("reset", "pm") and os.geteuid() != 0:
                # nvidia-smi(1) RETURN VALUE 4: no permission; NVML says "Insufficient Permissions"
                code, text = 4, "Unable to change this GPU: Insufficient Permissions\n"
            elif opts["mode"] == "reset":
                code, text = gpu_reset(state, opts, now)
            elif opts["mode"] == "pm":
                code, text = persistence(state, opts)
            else:
                code, text = 0, render(state, opts, now)
        except Usage as exc:
            code, text = exc.code, exc.text
    if kind == "garbled" and code == 0:
        text = garble(text)
    if kind == "inforom" and code == 0:
        bus = state["gpus"][0]["bus_id"]
        text, code = f"WARNING: infoROM is corrupted at gpu {bus[4:]}\n{text}", 14
    if kind == "lost":
        text, code = lost_line(state, fault) + text, 15 if code == 0 else code
    if opts["mode"] == "pm" and code == 0:
        await_daemon(node_dir, state.get("persistence", {}))
    sys.stdout.write(text)
    return code


def await_daemon(node_dir: str, modes: dict[str, int], limit_s: float = 5.0) -> None:
    """Return once the persistence daemon (if any) has done what ``modes`` asks, or after limit_s.

    The real ``-pm`` asks the daemon and answers after it acted.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with simstate.locked(node_dir):
            done = simstate.load(node_dir).get("persistence_done")
        if done is None or all(done.get(k, v) == v for k, v in modes.items()):
            return
        time.sleep(0.05)


def persistence(state: simstate.State, opts: simstate.Doc) -> tuple[int, str]:
    """``-pm 0|1 [-i N]``: ask the persistence daemon to let go of (or take) the GPUs.

    As a public incident write-up shows it: ``Disabled persistence mode for GPU <bus>.``, then
    the daemon no longer holds that GPU's device file; ``-pm 1`` answers ``Enabled persistence
    mode via daemon for GPU <bus>.``
    """
    modes = state.setdefault("persistence", {})
    lines = []
    for g in select_gpus(state, opts["ids"]):
        modes[str(g["index"])] = opts["pm"]
        said = "Enabled persistence mode via daemon" if opts["pm"] else "Disabled persistence mode"
        lines.append(f"{said} for GPU {g['bus_id']}.")
    return 0, "\n".join(lines) + "\nAll done.\n"


def parse_args(argv: list[str]) -> simstate.Doc:
    """Parse the subset of nvidia-smi's command line that the simulation knows."""
    opts: simstate.Doc = {"mode": "table", "ids": None, "fields": [], "format": None}
    it = iter(argv)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name in ("--query-gpu", "--query-compute-apps"):
            raw = value if eq else next(it, "")
            opts["mode"] = "gpu" if name == "--query-gpu" else "apps"
            opts["fields"] = [f.strip() for f in raw.split(",") if f.strip()]
        elif name == "--format":
            raw = value if eq else next(it, "")
            opts["format"] = [f.strip() for f in raw.split(",")]
        elif name in ("-i", "--id"):
            ids = value if eq else next(it, None)
            if ids is None:
                raise Usage(INVALID_ARGS)
            opts["ids"] = [x.strip() for x in ids.split(",")]
        elif arg.startswith("-i") and len(arg) > 2 and not eq:
            opts["ids"] = [x.strip() for x in arg[2:].split(",")]
        elif arg in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif arg in ("-q", "--query"):
            opts["mode"] = "q"
        elif arg == "nvlink" and next(it, None) in ("-s", "--status"):
            opts["mode"] = "nvlink"
        elif arg in ("-r", "--gpu-reset"):
            opts["mode"] = "reset"
        elif name in ("-pm", "--persistence-mode"):
            value = value if eq else next(it, "")
            if value not in ("0", "1", "ENABLED", "DISABLED"):
                raise Usage(INVALID_ARGS)
            opts["mode"], opts["pm"] = "pm", int(value in ("1", "ENABLED"))
        elif arg in ("-h", "--help"):
            raise Usage("NVIDIA System Management Interface -- v550.127.05 (simulated)\n", 0)
        else:
            raise Usage(INVALID_ARGS)
    if opts["mode"] in ("gpu", "apps"):
        fmt = opts["format"]
        if not fmt or fmt[0] != "csv" or any(f not in ("noheader", "nounits") for f in fmt[1:]):
            raise Usage(INVALID_ARGS)
        if not opts["fields"]:
            raise Usage(INVALID_ARGS)
    return opts


def select_gpus(state: simstate.State, ids: list[str] | None) -> list[simstate.Doc]:
    """Return the GPUs ``-i`` names (all without ``-i``); raise ``Usage`` for an unknown one.

    A lost GPU (fault ``lost``) answers nothing: it is left out; so is a vanished one, silently.
    """
    fault = state.get("fault") or {}
    gone = {*state.get("health", {}).get("vanished", ())}  # gpusim.health_faults.vanish
    gone |= {fault.get("gpu")} if fault.get("kind") == "lost" else set()
    gpus: list[simstate.Doc] = [g for g in state["gpus"] if g["index"] not in gone]
    if ids is None:
        return gpus
    out: list[simstate.Doc] = []
    for ident in ids:
        match = [
            g
            for g in gpus
            if ident == str(g["index"])
            or ident.lower() == g["uuid"].lower()
            or ident.upper() in (g["bus_id"], g["bus_id"][4:])
        ]
        if not match:
            raise Usage(NO_DEVICES, 6)
        out.extend(m for m in match if m not in out)
    return sorted(out, key=lambda g: g["index"])


def render(state: simstate.State, opts: simstate.Doc, now: float) -> str:
    """Render the output of a query, ``-L`` or the default table."""
    gpus = select_gpus(state, opts["ids"])
    usage = simstate.gpu_usage(state, now)
    if opts["mode"] == "list":
        return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    if opts["mode"] == "table":
        return table(state, gpus, usage, now)
    if opts["mode"] == "nvlink":
        return nvlink_status(state, gpus)
    if opts["mode"] == "q":
        return query_sections(state, gpus)
    noheader = "noheader" in opts["format"]
    nounits = "nounits" in opts["format"]
    if opts["mode"] == "gpu":
        names = [GPU_ALIASES.get(f, f) for f in opts["fields"]]
        units = GPU_FIELDS
    else:
        names = [APP_ALIASES.get(f, f) for f in opts["fields"]]
        units = APP_FIELDS
    for raw, name in zip(opts["fields"], names, strict=True):
        if name not in units or unknown_fields(state, [raw]):
            raise Usage(f'Field "{raw}" is not a valid field to query.\n\n')
    lines = []
    if not noheader:
        lines.append(", ".join(f"{n} [{units[n]}]" if units[n] else n for n in names))
    if opts["mode"] == "gpu":
        for g in gpus:
            values = gpu_values(state, g, usage[g["index"]])
            over = state["overrides"]["gpu"]
            special = {**over.get("*", {}), **over.get(str(g["index"]), {})}
            lines.append(", ".join(cell(n, values[n], units[n], nounits, special) for n in names))
    else:
        by_index = {g["index"]: g for g in gpus}
        special = state["overrides"]["apps"]
        for a in state["allocs"]:
            if not simstate.listed(a) or a["gpu"] not in by_index:
                continue
            g = by_index[a["gpu"]]
            values = {
                "pid": a["pid"],
                "process_name": simstate.cmdline_name(a["pid"]) or a["name"],
                "gpu_uuid": g["uuid"],
                "gpu_name": g["name"],
                "gpu_bus_id": g["bus_id"],
                "used_gpu_memory": a["mib"],
            }
            lines.append(", ".join(cell(n, values[n], units[n], nounits, special) for n in names))
    return "".join(line + "\n" for line in lines)


def gpu_values(state: simstate.State, g: simstate.Doc, use: tuple[int, int]) -> simstate.Doc:
    """Return every queryable value of one GPU."""
    used, util = use
    return {
        "index": g["index"],
        "uuid": g["uuid"],
        "name": g["name"],
        "pci.bus_id": g["bus_id"],
        "mig.mode.current": g.get("mig", "Disabled"),
        "memory.total": g["memory_total"],
        "memory.used": used,
        "memory.free": max(0, g["memory_total"] - used),
        "utilization.gpu": util,
        "count": len(state["gpus"]),
        "driver_version": state["driver_version"],
        **health_values(state, g),
    }


def cell(name: str, value: object, unit: str, nounits: bool, special: dict[str, str]) -> str:
    """Format one CSV cell: ``[N/A]``-style overrides win, units follow the value."""
    if name in special:
        return special[name]
    if unit and not nounits:
        return f"{value} {unit}"
    return str(value)


def table(
    state: simstate.State, gpus: list[simstate.Doc], usage: dict[int, tuple[int, int]], now: float
) -> str:
    """Render the default ``nvidia-smi`` table (driver 550 layout)."""

    def row(c1: str, c2: str, c3: str) -> str:
        return f"|{c1:<41}|{c2:>24}|{c3:>22}|"

    bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    wide = "+" + "-" * 89 + "+"
    ver = state["driver_version"]
    head = f" NVIDIA-SMI {ver:<22}Driver Version: {ver:<15}CUDA Version: {state['cuda_version']}"
    out = [
        datetime.fromtimestamp(now).strftime("%a %b %d %H:%M:%S %Y") + "       ",
        wide,
        f"|{head:<89}|",
        "|" + bar[1:],
        row(
            " GPU  Name                 Persistence-M ",
            "Bus-Id          Disp.A ",
            "Volatile Uncorr. ECC ",
        ),
        row(" Fan  Temp   Perf          Pwr:Usage/Cap ", "Memory-Usage ", "GPU-Util  Compute M. "),
        row("", "", "MIG M. "),
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for g in gpus:
        used, util = usage[g["index"]]
        out.append(
            row(f"   {g['index']:<3}{g['name']}".ljust(37) + "On  ", g["bus_id"] + " Off ", "0 ")
        )
        c1 = f" N/A   {30 + util // 4}C    P0" + f"{70 + util * 6}W /  700W ".rjust(25)
        out.append(
            row(c1, f"{used}MiB / {g['memory_total']}MiB ", f"{util}%".rjust(8) + "      Default ")
        )
        out.append(row("", "", "Disabled "))
        out.append(bar)
    out += [
        " " * 91,
        wide,
        f"|{' Processes:':<89}|",
        f"|{'  GPU   GI   CI        PID   Type   Process name':<78}GPU Memory |",
        f"|{'        ID   ID':<78}Usage      |",
        "|" + "=" * 89 + "|",
    ]
    shown = {g["index"] for g in gpus}
    rows = 0
    for a in state["allocs"]:
        if simstate.listed(a) and a["gpu"] in shown:
            name = simstate.cmdline_name(a["pid"]) or a["name"]
            if len(name) > 38:
                name = "..." + name[-35:]
            left = f"  {a['gpu']:>3}   N/A  N/A  {a['pid']:>9}      C   {name}"
            out.append(f"|{left:<76}{str(a['mib']) + 'MiB':>12} |")
            rows += 1
    if not rows:
        out.append(f"|{'  No running processes found':<89}|")
    out.append(wide)
    return "".join(line + "\n" for line in out)


def holders(path: str) -> list[int]:
    """Return the pids that hold ``path`` open (those whose ``/proc/PID/fd`` we may read)."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if st.st_ino == target.st_ino and st.st_dev == target.st_dev:
                pids.append(int(entry))
                break
    return pids


def gpu_reset(state: simstate.State, opts: simstate.Doc, now: float) -> tuple[int, str]:
    """Reset the selected GPUs unless a process still uses one; return (exit code, output)."""
    try:
        gpus = select_gpus(state, opts["ids"])
    except Usage as exc:
        return exc.code, exc.text
    busy = []
    for g in gpus:
        in_use = any(
            a["gpu"] == g["index"] and simstate.is_alive(a["pid"], a["start_ticks"])
            for a in state["allocs"]
        )
        if in_use or holders(f"{state['dev_prefix']}{simstate.minor(state, g['index'])}"):
            busy.append(g)
    if busy:
        lines = ["The following GPUs could not be reset:"]
        lines += [f"  GPU {g['bus_id']}: In use by another client" for g in busy]
        text = "\n".join(lines) + "\n\n"
        text += RESET_IN_USE if len(busy) == 1 else RESET_IN_USE_MANY.format(n=len(busy))
        return 255, text
    for g in gpus:
        applied(state, g["index"])
        for a in state["allocs"]:
            if a["gpu"] == g["index"] and simstate.holds_memory(a, state, now):
                a["reset_at"] = now
    return 0, "".join(f"GPU {g['bus_id']} was successfully reset.\n" for g in gpus)
