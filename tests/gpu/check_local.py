#!/usr/bin/env python3
"""Compare NVML with nvidia-smi, and the probe with both, on a machine with a real NVIDIA GPU.

Also checks each GPU's device minor (NVML, the driver's /proc files, the device node and both
probes agree, and a process holding ``/dev/nvidia<minor>`` lands on that GPU's index), and that a
running ``nvidia-persistenced`` shows as ``system`` on every GPU, never as a job.

Run from the repository root: ``python tests/gpu/check_local.py`` (``--no-workload`` to skip the
CUDA allocation; as root to see a daemon of another account). It prints one line per check and
exits 0 when everything agrees, 1 on a mismatch, 2 when this machine cannot run the check (no GPU,
no driver). It needs no package beyond gpubot's own dependencies: the test workload allocates GPU
memory through ``libcuda`` via ctypes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpubot.config import SshSettings
from gpubot.core.flags import gpu_flags, process_flags
from gpubot.core.models import ComputeApp, GpuInfo, NodeConfig, NodeSnapshot
from gpubot.core.probe.nvsmi import (
    apps_query_argv,
    gpu_query_argv,
    normal_bus_id,
    parse_apps,
    parse_gpus,
)
from gpubot.core.reset.protect import DEFAULT_DAEMON_PATHS, DEFAULT_SYSTEM_USERS, Protection
from gpubot.errors import GpubotError
from gpubot.services.status import probe_node
from gpubot.transport import RoutingTransport
from gpubot.transport.local import LocalTransport, missing_functions, nvml_query

MEM_TOLERANCE_MIB = 64  # memory moves a little between two reads (other tenants, the driver)
WORKLOAD_MIB = 1024
DRIVER_DIR = Path("/proc/driver/nvidia/gpus")
NVIDIA_MAJOR = 195  # the character-device major of /dev/nvidia<minor> (the driver's README)
PERSISTENCED = "nvidia-persistenced"

# A child that allocates WORKLOAD_MIB on GPU 0 through the CUDA driver API, says "ready", and
# holds it until its stdin closes. Only ctypes: no torch, no CUDA toolkit.
WORKLOAD = f"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        print(f"{{what}} failed: {{rc}}", flush=True); sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ptr = ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({WORKLOAD_MIB} << 20)), "cuMemAlloc")
print("ready", flush=True)
sys.stdin.read()
"""


class Report:
    def __init__(self) -> None:
        self.failures = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
        self.failures += not ok
        return ok

    def note(self, what: str) -> None:
        print(f"     {what}", flush=True)


def close(a: int | None, b: int | None, tol: int) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tol)


def compare_gpus(r: Report, label: str, a: tuple[GpuInfo, ...], b: tuple[GpuInfo, ...]) -> None:
    r.check(
        [g.index for g in a] == [g.index for g in b],
        f"{label}: same GPU indices",
        f"{[g.index for g in a]} vs {[g.index for g in b]}",
    )
    for x, y in zip(a, b, strict=False):
        r.check(
            (x.uuid, x.name) == (y.uuid, y.name),
            f"{label}: GPU {x.index} uuid and name",
            f"{x.uuid} {x.name!r} vs {y.uuid} {y.name!r}",
        )
        r.check(
            x.memory_total_mib == y.memory_total_mib,
            f"{label}: GPU {x.index} memory.total",
            f"{x.memory_total_mib} vs {y.memory_total_mib} MiB",
        )
        r.check(
            close(x.memory_used_mib, y.memory_used_mib, MEM_TOLERANCE_MIB),
            f"{label}: GPU {x.index} memory.used within {MEM_TOLERANCE_MIB} MiB",
            f"{x.memory_used_mib} vs {y.memory_used_mib} MiB",
        )
        r.check(
            (x.utilization_pct is None) == (y.utilization_pct is None),
            f"{label}: GPU {x.index} utilization both known or both N/A",
            f"{x.utilization_pct} vs {y.utilization_pct}",
        )
        # Flags NVML has a case for (lost, requires-reset, mig); infoROM warnings are smi's.
        fx, fy = set(x.flags) - {"warning"}, set(y.flags) - {"warning"}
        r.check(fx == fy, f"{label}: GPU {x.index} flags agree", f"{x.flags} vs {y.flags}")


def compare_apps(r: Report, a: tuple[ComputeApp, ...], b: tuple[ComputeApp, ...]) -> None:
    ka = {(x.pid, x.gpu_uuid): x for x in a}
    kb = {(x.pid, x.gpu_uuid): x for x in b}
    r.check(
        set(ka) == set(kb),
        "NVML vs nvidia-smi: same (pid, GPU) compute apps",
        f"{sorted(ka)} vs {sorted(kb)}",
    )
    for key in set(ka) & set(kb):
        x, y = ka[key], kb[key]
        r.check(
            close(x.used_memory_mib, y.used_memory_mib, 2),
            f"app {key[0]}: used memory",
            f"{x.used_memory_mib} vs {y.used_memory_mib} MiB",
        )


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def check_snapshot(r: Report, label: str, snap: NodeSnapshot, workload: int | None) -> None:
    r.note(
        f"{label}: {len(snap.gpus)} GPUs, {len(snap.processes)} GPU processes, "
        f"{len(snap.ctl_only)} ctl-only"
    )
    for p in snap.processes:
        r.note(
            f"  gpu {p.gpu_index} pid {p.pid} {p.used_memory_mib} MiB "
            f"visible={p.visible_to_nvidia_smi} holds={p.holds_device_file} "
            f"user={p.user} state={p.state} cmd={(p.command or '')[:60]!r}"
        )
    if workload is None:
        return
    mine = [p for p in snap.processes if p.pid == workload and p.gpu_index == 0]
    if not r.check(len(mine) == 1, f"{label}: the test workload is on GPU 0"):
        return
    p = mine[0]
    gpu0 = snap.gpu(0)
    dev = "/dev/nvidia?" if gpu0 is None or gpu0.minor is None else f"/dev/nvidia{gpu0.minor}"
    r.check(p.holds_device_file, f"{label}: fuser sees the workload hold GPU 0's {dev}")
    r.check(p.start_ticks == start_ticks(workload), f"{label}: start ticks match /proc")
    if p.visible_to_nvidia_smi:
        r.check(
            close(p.used_memory_mib, WORKLOAD_MIB, 600),
            f"{label}: workload memory about {WORKLOAD_MIB} MiB",
            f"{p.used_memory_mib}",
        )
    else:
        r.note(f"{label}: nvidia-smi does not list the workload (another PID namespace?)")


def start_workload(r: Report) -> subprocess.Popen[str] | None:
    """Start the CUDA allocation; None when it could not allocate."""
    # CUDA's device 0 is NVML's GPU 0 only in PCI order (CUDA's default is fastest first).
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    w = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert w.stdout is not None
    line = w.stdout.readline().strip()
    if not r.check(line == "ready", "CUDA workload allocated memory", line):
        w.kill()
        w.wait()
        return None
    time.sleep(1.0)  # let NVML's accounting catch up
    return w


def main() -> int:
    """Run every check; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-workload", action="store_true", help="do not allocate GPU memory")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare")
    args = parser.parse_args()
    r = Report()
    try:
        gpus, _ = nvml_query("local")
    except GpubotError as exc:
        print(f"SKIP this machine cannot run the check: {exc}")
        return 2
    r.check(bool(gpus), "NVML lists GPUs", f"{len(gpus)}")
    workload = None if args.no_workload else start_workload(r)
    try:
        asyncio.run(checks(r, args.nvidia_smi, workload.pid if workload else None))
    finally:
        if workload is not None:
            workload.kill()
            workload.wait()
    print(f"{'PASS' if r.failures == 0 else 'FAIL'}: {r.failures} failed check(s)", flush=True)
    return 0 if r.failures == 0 else 1


async def checks(r: Report, smi: str, pid: int | None) -> None:
    """Compare NVML with nvidia-smi, then both probes (NVML and the nvidia-smi fallback)."""
    node = NodeConfig(name="local", host="local", nvidia_smi=smi)
    local = LocalTransport(SshSettings(command_timeout_s=60))
    t0 = time.perf_counter()
    gpus, apps = nvml_query("local")
    t_nvml = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = await local.run(node, gpu_query_argv(smi))
    a = await local.run(node, apps_query_argv(smi))
    t_smi = time.perf_counter() - t0
    if not r.check(
        g.exit_status == 0 and a.exit_status == 0,
        "nvidia-smi queries succeed",
        (g.stderr or g.stdout or a.stderr).strip()[:200],
    ):
        return
    r.note(f"NVML read in {t_nvml * 1000:.0f} ms, two nvidia-smi queries in {t_smi * 1000:.0f} ms")
    try:
        smi_gpus, smi_apps = parse_gpus(g.stdout), parse_apps(a.stdout)
    except GpubotError as exc:
        r.check(False, "nvidia-smi output parses strictly", str(exc))
        return
    r.check(
        True, "nvidia-smi output parses strictly", f"{len(smi_gpus)} GPUs, {len(smi_apps)} apps"
    )
    compare_gpus(r, "NVML vs nvidia-smi", gpus, smi_gpus)
    compare_apps(r, apps, smi_apps)
    # Also the formats with header and units, which the parsers accept too.
    res_g = await local.run(node, [*gpu_query_argv(smi)[:2], "--format=csv"])
    res_a = await local.run(node, [*apps_query_argv(smi)[:2], "--format=csv"])
    try:
        units_g, units_a = parse_gpus(res_g.stdout), parse_apps(res_a.stdout)
        r.check(
            [x.uuid for x in units_g] == [x.uuid for x in smi_gpus]
            and {x.pid for x in units_a} == {x.pid for x in smi_apps},
            "--format=csv (header, units) parses to the same tables",
        )
    except GpubotError as exc:
        r.check(False, "--format=csv (header, units) parses", str(exc))

    missing = sorted(missing_functions())
    r.note(f"NVML calls this driver lacks (asked once, then skipped): {missing or 'none'}")

    daemons = find_daemons(PERSISTENCED)
    protection = protection_for(r, daemons)
    holders = start_holders(r, gpus)
    try:
        await probes(r, node, gpus, pid, holders, daemons, protection)
    finally:
        for h in holders.values():
            h.kill()
            h.wait()


async def probes(
    r: Report,
    node: NodeConfig,
    gpus: tuple[GpuInfo, ...],
    pid: int | None,
    holders: dict[int, subprocess.Popen[bytes]],
    daemons: dict[int, Daemon],
    protection: Protection,
) -> None:
    """Run the probe with NVML and forced onto nvidia-smi; check each snapshot, then compare."""
    snap = None
    with_nvml = RoutingTransport(SshSettings(command_timeout_s=60))
    try:
        snap = await probe_node(
            with_nvml, node, smi_timeout_s=20, taken_at=time.time(), protection=protection
        )
        check_snapshot(r, "probe (NVML)", snap, pid)
        check_minors(r, "probe (NVML)", gpus, snap)
        check_holders(r, "probe (NVML)", snap, holders)
        check_daemons(r, "probe (NVML)", snap, daemons)
    except GpubotError as exc:
        r.check(False, "probe (NVML)", str(exc))
    without = RoutingTransport(SshSettings(command_timeout_s=60))
    without.local = LocalTransport(SshSettings(command_timeout_s=60), nvml=NoNvml())
    try:
        snap2 = await probe_node(
            without, node, smi_timeout_s=20, taken_at=time.time(), protection=protection
        )
        check_snapshot(r, "probe (nvidia-smi fallback)", snap2, pid)
        check_minors(r, "probe (nvidia-smi fallback)", gpus, snap2)
        check_holders(r, "probe (nvidia-smi fallback)", snap2, holders)
        check_daemons(r, "probe (nvidia-smi fallback)", snap2, daemons)
        if snap is not None:
            compare_gpus(r, "probe NVML vs probe nvidia-smi", snap.gpus, snap2.gpus)
            r.check(
                [g.minor for g in snap.gpus] == [g.minor for g in snap2.gpus],
                "both probes give each GPU the same device minor",
            )
            r.check(
                {(p.pid, p.gpu_index) for p in snap.processes}
                == {(p.pid, p.gpu_index) for p in snap2.processes},
                "both probes see the same GPU processes",
            )
    except GpubotError as exc:
        r.check(False, "probe (nvidia-smi fallback)", str(exc))
    if daemons and snap is not None and any(d.visible for d in daemons.values()):
        # The negative: with no protected paths the daemon is a hidden job like any other.
        try:
            bare = await probe_node(
                with_nvml,
                node,
                smi_timeout_s=20,
                taken_at=time.time(),
                protection=Protection(paths=()),
            )
        except GpubotError as exc:
            r.check(False, "probe (NVML) without protected paths", str(exc))
            return
        seen = [p for p in bare.processes if p.pid in daemons]
        r.check(
            bool(seen) and not any(p.system for p in seen),
            f"without protected paths {PERSISTENCED} is not `system` (the paths decide)",
            f"{[(p.pid, p.gpu_index, process_flags(p)) for p in seen]}",
        )


# ---- device minors -----------------------------------------------------------------------------


def driver_minor(bus_id: str | None) -> int | None:
    """Return "Device Minor" from the driver's /proc file for ``bus_id``, or None."""
    folder = normal_bus_id(bus_id) if bus_id else None
    if folder is None:
        return None
    try:
        text = (DRIVER_DIR / folder / "information").read_text()
    except OSError:
        return None
    m = re.search(r"^Device Minor:\s*(\d+)\s*$", text, re.MULTILINE)
    return int(m[1]) if m else None


def check_minors(r: Report, label: str, nvml: tuple[GpuInfo, ...], snap: NodeSnapshot) -> None:
    """NVML's minor, the driver's "Device Minor", the device node and the probe's all agree."""
    by_index = {g.index: g for g in snap.gpus}
    for g in nvml:
        if "lost" in g.flags:
            r.note(f"{label}: GPU {g.index} is lost: its minor is not checked")
            continue
        driver = driver_minor(g.bus_id)
        r.check(
            driver is not None,
            f"{label}: GPU {g.index} has a Device Minor in {DRIVER_DIR}/<bus id>/information",
            f"bus {g.bus_id}",
        )
        r.check(
            g.minor == driver,
            f"{label}: GPU {g.index} NVML minor = the driver's",
            f"{g.minor} vs {driver}",
        )
        probed = by_index.get(g.index)
        r.check(
            probed is not None and probed.minor == driver,
            f"{label}: GPU {g.index} probe's GpuInfo.minor = the driver's",
            f"{probed.minor if probed else 'no such GPU'} vs {driver}",
        )
        if driver is None:
            continue
        path = f"/dev/nvidia{driver}"
        try:
            st = os.stat(path)
            rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
            ok = stat.S_ISCHR(st.st_mode) and rdev == (NVIDIA_MAJOR, driver)
            r.check(
                ok, f"{label}: {path} is the character device {NVIDIA_MAJOR}:{driver}", f"{rdev}"
            )
        except OSError as exc:
            r.check(False, f"{label}: {path} exists", str(exc))
        if g.index != driver:
            r.note(f"{label}: GPU {g.index} is /dev/nvidia{driver}: index != minor on this box")
    minors = [g.minor for g in snap.gpus if g.minor is not None]
    r.check(
        len(minors) == len(set(minors)), f"{label}: no two GPUs share a device minor", f"{minors}"
    )


def start_holders(r: Report, gpus: tuple[GpuInfo, ...]) -> dict[int, subprocess.Popen[bytes]]:
    """Start one process per GPU that holds only that GPU's device file (by its minor)."""
    out: dict[int, subprocess.Popen[bytes]] = {}
    for g in gpus:
        minor = g.minor if g.minor is not None else driver_minor(g.bus_id)
        if minor is None:
            r.note(f"GPU {g.index}: minor unknown: no device-file holder started for it")
            continue
        try:
            with open(f"/dev/nvidia{minor}", "rb") as f:
                out[g.index] = subprocess.Popen(["sleep", "600"], stdin=f)
        except OSError as exc:
            r.note(f"GPU {g.index}: cannot open /dev/nvidia{minor} ({exc}): no holder for it")
    return out


def check_holders(
    r: Report, label: str, snap: NodeSnapshot, holders: dict[int, subprocess.Popen[bytes]]
) -> None:
    """Each holder of /dev/nvidia<minor> is on that GPU's index, and on no other GPU."""
    for index, h in holders.items():
        on = sorted(p.gpu_index for p in snap.processes if p.pid == h.pid)
        r.check(
            on == [index],
            f"{label}: the holder of GPU {index}'s device file (pid {h.pid}) "
            f"is on GPU {index} alone",
            f"on {on}",
        )
        mine = [p for p in snap.processes if p.pid == h.pid]
        r.check(
            all(p.hidden for p in mine),
            f"{label}: that holder is a hidden holder (nvidia-smi lists it on no GPU)",
        )


# ---- the persistence daemon ---------------------------------------------------------------------


class Daemon:
    """A running daemon: its executable (or argv[0]) and effective account."""

    def __init__(self, pid: int, exe: str, uid: int) -> None:
        self.pid, self.exe, self.uid = pid, exe, uid
        try:
            self.user = pwd.getpwuid(uid).pw_name
        except KeyError:
            self.user = str(uid)
        # fuser sees another account's open files only as root.
        self.visible = os.geteuid() in (0, uid)


def find_daemons(name: str) -> dict[int, Daemon]:
    """Return the running processes called ``name`` (comm is cut at 15 characters)."""
    out: dict[int, Daemon] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != name[:15]:
                continue
            try:
                exe = os.readlink(d / "exe")
            except OSError:  # another account's, and we are not root: argv[0] says it
                exe = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            uid = next(
                int(line.split()[2])
                for line in (d / "status").read_text().splitlines()
                if line.startswith("Uid:")
            )
        except (OSError, StopIteration, IndexError, ValueError):
            continue  # it ended while being read
        out[int(d.name)] = Daemon(int(d.name), exe.removesuffix(" (deleted)"), uid)
    return out


def protection_for(r: Report, daemons: dict[int, Daemon]) -> Protection:
    """Return gpubot's default protection, with the daemons' executables and accounts in it."""
    paths, users = list(DEFAULT_DAEMON_PATHS), list(DEFAULT_SYSTEM_USERS)
    if not daemons:
        r.note(f"{PERSISTENCED} is not running: its checks are skipped")
    for d in daemons.values():
        r.note(f"{PERSISTENCED}: pid {d.pid}, {d.exe}, user {d.user}")
        if d.exe not in paths:
            r.note(
                f"  {d.exe} is not among the default protected paths: added for this check "
                "(list it in [reset] protected)"
            )
            paths.append(d.exe)
        if d.user not in users and d.uid != 0:
            r.note(f"  {d.user} is not among the default system users: added for this check")
            users.append(d.user)
    return Protection(tuple(paths), tuple(users))


def check_daemons(r: Report, label: str, snap: NodeSnapshot, daemons: dict[int, Daemon]) -> None:
    """The persistence daemon is `system` on every GPU, never a job; it changes no GPU flag."""
    for d in daemons.values():
        if not d.visible:
            r.note(
                f"{label}: {PERSISTENCED} runs as {d.user}, this check not as root: fuser "
                f"cannot see its files (unseen={snap.unseen}); run as root to check it"
            )
            continue
        for g in snap.gpus:
            if g.minor is None:
                r.note(f"{label}: GPU {g.index}: minor unknown, holders not attributed")
                continue
            procs = snap.on_gpu(g.index)
            mine = [p for p in procs if p.pid == d.pid]
            seen = [(process_flags(p), p.exe or p.argv0) for p in mine]
            r.check(
                len(mine) == 1 and mine[0].system and process_flags(mine[0]) == ("system",),
                f"{label}: {PERSISTENCED} (pid {d.pid}) is `system` on GPU {g.index}",
                f"{seen or 'not seen'}",
            )
            others = tuple(p for p in procs if p.pid != d.pid)
            r.check(
                gpu_flags(g, procs) == gpu_flags(g, others),
                f"{label}: it changes no flag of GPU {g.index} (not a job, hides no leak)",
                f"{gpu_flags(g, procs)} vs {gpu_flags(g, others)}",
            )


class NoNvml:
    """A pynvml stand-in whose library is missing: forces the nvidia-smi fallback."""

    class NVMLError(Exception):
        value = 12  # NVML_ERROR_LIBRARY_NOT_FOUND

    def nvmlInit(self) -> None:
        raise self.NVMLError()


if __name__ == "__main__":
    sys.exit(main())
