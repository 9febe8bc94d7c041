#!/usr/bin/env python3
"""Compare NVML with nvidia-smi, and the probe with both, on a machine with a real NVIDIA GPU.

Run from the repository root: ``python tests/gpu/check_local.py`` (``--no-workload`` to skip the
CUDA allocation). It prints one line per check and exits 0 when everything agrees, 1 on a
mismatch, 2 when this machine cannot run the check (no GPU, no driver). It needs no package beyond
gpubot's own dependencies: the test workload allocates GPU memory through ``libcuda`` via ctypes.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpubot.config import SshSettings
from gpubot.core.models import ComputeApp, GpuInfo, NodeConfig, NodeSnapshot
from gpubot.core.nvsmi import apps_query_argv, gpu_query_argv, parse_apps, parse_gpus
from gpubot.errors import GpubotError
from gpubot.services.status import probe_node
from gpubot.ssh import RoutingTransport
from gpubot.ssh.local import LocalTransport, nvml_query

MEM_TOLERANCE_MIB = 64  # memory moves a little between two reads (other tenants, the driver)
WORKLOAD_MIB = 1024

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
    r.check([g.index for g in a] == [g.index for g in b], f"{label}: same GPU indices",
            f"{[g.index for g in a]} vs {[g.index for g in b]}")  # fmt: skip
    for x, y in zip(a, b, strict=False):
        r.check((x.uuid, x.name) == (y.uuid, y.name), f"{label}: GPU {x.index} uuid and name",
                f"{x.uuid} {x.name!r} vs {y.uuid} {y.name!r}")  # fmt: skip
        r.check(x.memory_total_mib == y.memory_total_mib, f"{label}: GPU {x.index} memory.total",
                f"{x.memory_total_mib} vs {y.memory_total_mib} MiB")  # fmt: skip
        r.check(close(x.memory_used_mib, y.memory_used_mib, MEM_TOLERANCE_MIB),
                f"{label}: GPU {x.index} memory.used within {MEM_TOLERANCE_MIB} MiB",
                f"{x.memory_used_mib} vs {y.memory_used_mib} MiB")  # fmt: skip
        r.check((x.utilization_pct is None) == (y.utilization_pct is None),
                f"{label}: GPU {x.index} utilization both known or both N/A",
                f"{x.utilization_pct} vs {y.utilization_pct}")  # fmt: skip


def compare_apps(r: Report, a: tuple[ComputeApp, ...], b: tuple[ComputeApp, ...]) -> None:
    ka = {(x.pid, x.gpu_uuid): x for x in a}
    kb = {(x.pid, x.gpu_uuid): x for x in b}
    r.check(set(ka) == set(kb), "NVML vs nvidia-smi: same (pid, GPU) compute apps",
            f"{sorted(ka)} vs {sorted(kb)}")  # fmt: skip
    for key in set(ka) & set(kb):
        x, y = ka[key], kb[key]
        r.check(close(x.used_memory_mib, y.used_memory_mib, 2), f"app {key[0]}: used memory",
                f"{x.used_memory_mib} vs {y.used_memory_mib} MiB")  # fmt: skip


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def check_snapshot(r: Report, label: str, snap: NodeSnapshot, workload: int | None) -> None:
    r.note(f"{label}: {len(snap.gpus)} GPUs, {len(snap.processes)} GPU processes, "
           f"{len(snap.ctl_only)} ctl-only")  # fmt: skip
    for p in snap.processes:
        r.note(f"  gpu {p.gpu_index} pid {p.pid} {p.used_memory_mib} MiB "
               f"visible={p.visible_to_nvidia_smi} holds={p.holds_device_file} "
               f"user={p.user} state={p.state} cmd={(p.command or '')[:60]!r}")  # fmt: skip
    if workload is None:
        return
    mine = [p for p in snap.processes if p.pid == workload and p.gpu_index == 0]
    if not r.check(len(mine) == 1, f"{label}: the test workload is on GPU 0"):
        return
    p = mine[0]
    r.check(p.holds_device_file, f"{label}: fuser sees the workload hold /dev/nvidia0")
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
    w = subprocess.Popen([sys.executable, "-c", WORKLOAD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
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
    if not r.check(g.exit_status == 0 and a.exit_status == 0, "nvidia-smi queries succeed",
                   (g.stderr or g.stdout or a.stderr).strip()[:200]):  # fmt: skip
        return
    r.note(f"NVML read in {t_nvml * 1000:.0f} ms, two nvidia-smi queries in "
           f"{t_smi * 1000:.0f} ms")  # fmt: skip
    try:
        smi_gpus, smi_apps = parse_gpus(g.stdout), parse_apps(a.stdout)
    except GpubotError as exc:
        r.check(False, "nvidia-smi output parses strictly", str(exc))
        return
    r.check(True, "nvidia-smi output parses strictly",
            f"{len(smi_gpus)} GPUs, {len(smi_apps)} apps")  # fmt: skip
    compare_gpus(r, "NVML vs nvidia-smi", gpus, smi_gpus)
    compare_apps(r, apps, smi_apps)
    # Also the formats with header and units, which the parsers accept too.
    res_g = await local.run(node, [*gpu_query_argv(smi)[:2], "--format=csv"])
    res_a = await local.run(node, [*apps_query_argv(smi)[:2], "--format=csv"])
    try:
        units_g, units_a = parse_gpus(res_g.stdout), parse_apps(res_a.stdout)
        r.check([x.uuid for x in units_g] == [x.uuid for x in smi_gpus]
                and {x.pid for x in units_a} == {x.pid for x in smi_apps},
                "--format=csv (header, units) parses to the same tables")  # fmt: skip
    except GpubotError as exc:
        r.check(False, "--format=csv (header, units) parses", str(exc))

    snap = None
    with_nvml = RoutingTransport(SshSettings(command_timeout_s=60))
    try:
        snap = await probe_node(with_nvml, node, smi_timeout_s=20, taken_at=time.time())
        check_snapshot(r, "probe (NVML)", snap, pid)
    except GpubotError as exc:
        r.check(False, "probe (NVML)", str(exc))
    without = RoutingTransport(SshSettings(command_timeout_s=60))
    without.local = LocalTransport(SshSettings(command_timeout_s=60), nvml=NoNvml())
    try:
        snap2 = await probe_node(without, node, smi_timeout_s=20, taken_at=time.time())
        check_snapshot(r, "probe (nvidia-smi fallback)", snap2, pid)
        if snap is not None:
            compare_gpus(r, "probe NVML vs probe nvidia-smi", snap.gpus, snap2.gpus)
            r.check({(p.pid, p.gpu_index) for p in snap.processes}
                    == {(p.pid, p.gpu_index) for p in snap2.processes},
                    "both probes see the same GPU processes")  # fmt: skip
    except GpubotError as exc:
        r.check(False, "probe (nvidia-smi fallback)", str(exc))


class NoNvml:
    """A pynvml stand-in whose library is missing: forces the nvidia-smi fallback."""

    class NVMLError(Exception):
        value = 12  # NVML_ERROR_LIBRARY_NOT_FOUND

    def nvmlInit(self) -> None:
        raise self.NVMLError()


if __name__ == "__main__":
    sys.exit(main())
