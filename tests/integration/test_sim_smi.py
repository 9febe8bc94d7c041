"""The stand-in nvidia-smi of a simulated node prints what the real one prints."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import gpusim
from gpubot.core.probe import nvsmi
from gpusim.fleet import SimFleet, SimNode
from gpusim.fleet_setup import STANDALONE
from gpusim.node import bus_id

GPU_Q = nvsmi.gpu_query_argv("x")[1]  # the GPU query gpubot asks
APP_Q = "--query-compute-apps=pid,gpu_uuid,used_memory,process_name"
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def smi(node: SimNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([node.nvidia_smi, *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def node(sim_fleet: SimFleet) -> Iterator[SimNode]:
    """node1 of the module's fleet, left clean for the next test."""
    n = sim_fleet.node("node1")
    n.clear()
    yield n
    n.clear()


def test_gpu_query_with_header_and_units(node: SimNode) -> None:
    node.spawn(gpu=2, mib=4096, util_pct=37)
    out = smi(node, GPU_Q, "--format=csv")
    assert out.returncode == 0 and out.stderr == ""
    assert GPU_Q == (
        "--query-gpu=index,uuid,pci.bus_id,mig.mode.current,name,memory.used,memory.total,"
        "utilization.gpu"
    )
    lines = out.stdout.split("\n")
    assert lines[0] == (
        "index, uuid, pci.bus_id, mig.mode.current, name, memory.used [MiB], memory.total [MiB], "
        "utilization.gpu [%]"
    )
    assert lines[-1] == "" and len(lines) == 1 + 8 + 1  # header, 8 GPUs, final newline
    row = lines[3].split(", ")
    assert row[0] == "2" and UUID.fullmatch(row[1]) and row[2] == "00000000:3A:00.0"
    assert row[3] == "Disabled" and row[4] == "NVIDIA H200"
    assert row[5:] == ["4096 MiB", "143771 MiB", "37 %"]
    assert lines[1].endswith(", 00000000:18:00.0, Disabled, NVIDIA H200, 0 MiB, 143771 MiB, 0 %")


def test_gpu_query_noheader_nounits_parses_with_gpubots_parser(node: SimNode) -> None:
    node.spawn(gpu=0, mib=1000, util_pct=30)
    node.spawn(gpu=0, mib=500, util_pct=90)  # utilisation adds up, capped at 100
    out = smi(node, GPU_Q, "--format=csv,noheader,nounits")
    first = out.stdout.splitlines()[0].split(", ")
    assert first[0] == "0" and first[2] == "00000000:18:00.0"
    assert first[3] == "Disabled" and first[5:] == ["1500", "143771", "100"]
    gpus = nvsmi.parse_gpus(out.stdout)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].memory_used_mib == 1500 and gpus[0].utilization_pct == 100
    assert [g.bus_id for g in gpus] == [bus_id(i) for i in range(8)]
    assert all(g.minor is None for g in gpus)  # nvidia-smi never says it: the probe finds it
    normal = [nvsmi.normal_bus_id(g.bus_id or "") for g in gpus]
    assert normal[0] == "0000:18:00.0" and normal[4] == "0000:9a:00.0"
    assert len(set(normal)) == 8  # one driver folder per GPU
    # noheader alone keeps the units, nounits alone keeps the header (with its units)
    assert (
        smi(node, GPU_Q, "--format=csv,noheader")
        .stdout.splitlines()[0]
        .endswith(", 1500 MiB, 143771 MiB, 100 %")
    )
    assert (
        smi(node, GPU_Q, "--format=csv,nounits")
        .stdout.splitlines()[0]
        .startswith("index, uuid, pci.bus_id, mig.mode.current, name, memory.used [MiB]")
    )


def test_uuids_are_stable_per_node_and_index(sim_fleet: SimFleet) -> None:
    def uuids(n: SimNode) -> list[str]:
        return smi(n, "--query-gpu=uuid", "--format=csv,noheader").stdout.split()

    a, b = sim_fleet.node("node1"), sim_fleet.node("node2")
    assert uuids(a) == uuids(a)
    assert len(set(uuids(a) + uuids(b))) == 16
    listing = smi(a, "-L").stdout.splitlines()
    assert listing[3] == f"GPU 3: NVIDIA H200 (UUID: {uuids(a)[3]})"
    assert len(listing) == 8


def test_compute_apps_query(node: SimNode) -> None:
    w = node.spawn(gpu=5, mib=2048)
    uuid5 = smi(node, "--query-gpu=uuid", "--format=csv,noheader", "-i", "5").stdout.strip()
    out = smi(node, APP_Q, "--format=csv")
    assert out.stdout == (
        f"pid, gpu_uuid, used_gpu_memory [MiB], process_name\n{w.pid}, {uuid5}, 2048 MiB, python3\n"
    )
    bare = smi(node, APP_Q, "--format=csv,noheader,nounits").stdout
    assert bare == f"{w.pid}, {uuid5}, 2048, python3\n"
    ours = smi(node, *nvsmi.apps_query_argv("x")[1:]).stdout  # gpubot never asks for the name
    (app,) = nvsmi.parse_apps(ours)
    assert (app.pid, app.gpu_uuid, app.used_memory_mib) == (w.pid, uuid5, 2048)


def test_no_processes_prints_header_only_and_the_table_says_so(node: SimNode) -> None:
    assert smi(node, APP_Q, "--format=csv").stdout == (
        "pid, gpu_uuid, used_gpu_memory [MiB], process_name\n"
    )
    assert smi(node, APP_Q, "--format=csv,noheader").stdout == ""
    table = smi(node).stdout
    assert "|  No running processes found" in table
    assert "NVIDIA H200" in table and "0MiB / 143771MiB" in table
    lines = table.splitlines()[1:]
    assert {len(line) for line in lines} == {91}  # a well-formed box
    w = node.spawn(gpu=1, mib=3000)
    table = smi(node).stdout
    assert "No running processes found" not in table
    assert re.search(rf"\|\s+1\s+N/A\s+N/A\s+{w.pid}\s+C\s+python3\s+3000MiB \|", table)


def test_id_filter_by_index_list_and_uuid(node: SimNode) -> None:
    node.spawn(gpu=3, mib=100)
    w6 = node.spawn(gpu=6, mib=600)
    rows = smi(node, "--query-gpu=index,memory.used", "--format=csv,noheader", "-i", "3,6")
    assert rows.stdout == "3, 100 MiB\n6, 600 MiB\n"
    uuid6 = smi(node, "--query-gpu=uuid", "--format=csv,noheader", "--id=6").stdout.strip()
    assert smi(node, "--query-gpu=index", "--format=csv,noheader", "-i", uuid6).stdout == "6\n"
    apps = smi(node, "--query-compute-apps=pid,used_memory", "--format=csv,noheader", "-i", "6")
    assert apps.stdout == f"{w6.pid}, 600 MiB\n"


@pytest.mark.parametrize("ident", ["8", "42", "GPU-00000000-0000-0000-0000-000000000000"])
def test_unknown_gpu_is_no_devices_found(node: SimNode, ident: str) -> None:
    out = smi(node, "--query-gpu=index", "--format=csv", "-i", ident)
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")


def test_na_and_not_supported_fields(node: SimNode) -> None:
    node.spawn(gpu=0, mib=512)
    node.override("gpu", "utilization.gpu", "[N/A]")
    node.override("gpu", "memory.used", "[Not Supported]", gpu=1)
    node.override("apps", "used_memory", "[N/A]")
    node.override("gpu", "pci.bus_id", "[N/A]", gpu=2)
    gpu = smi(node, "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,nounits")
    lines = gpu.stdout.splitlines()
    assert lines[1:3] == ["0, 512, [N/A]", "1, [Not Supported], [N/A]"]
    parsed = nvsmi.parse_gpus(smi(node, GPU_Q, "--format=csv,noheader,nounits").stdout)
    assert parsed[0].utilization_pct is None and parsed[1].memory_used_mib is None
    assert parsed[0].memory_used_mib == 512
    assert parsed[2].bus_id is None and parsed[1].bus_id == bus_id(1)  # never a made-up bus id
    apps = smi(node, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader")
    (app,) = nvsmi.parse_apps(apps.stdout)
    assert apps.stdout.endswith(", [N/A]\n") and app.used_memory_mib is None


@pytest.mark.parametrize(
    "args",
    [
        ["--query-gpu=index,bogus", "--format=csv"],
        ["--query-gpu=index"],
        ["--query-gpu=index", "--format=xml"],
        ["--frobnicate"],
    ],
)
def test_bad_arguments_fail_like_the_real_one(node: SimNode, args: list[str]) -> None:
    out = smi(node, *args)
    assert out.returncode == 2
    assert out.stdout.startswith(('Field "bogus" is not a valid field', "Invalid combination"))


def test_concurrent_calls_see_a_consistent_state(node: SimNode) -> None:
    def call(_: int) -> str:
        return smi(node, GPU_Q, "--format=csv,noheader,nounits").stdout

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, i) for i in range(16)]
        spawned = [node.spawn(gpu=i % 8, mib=100 * (i + 1)) for i in range(4)]
        outputs = [f.result() for f in futures]
    for text in outputs:
        gpus = nvsmi.parse_gpus(text)  # never a torn or half-written answer
        assert len(gpus) == 8
        used = [g.memory_used_mib for g in gpus]
        # Workloads register in order: each answer shows a prefix of them.
        k = sum(1 for u in used[:4] if u)
        assert used[:4] == [100 * (i + 1) if i < k else 0 for i in range(4)]
    assert len(spawned) == 4


def test_gpu_reset_refused_while_in_use_then_frees_orphaned_memory(node: SimNode) -> None:
    node.release_delay_s = 0.2
    try:
        w = node.spawn(gpu=4, mib=9000, behaviour="orphan")
        busy = smi(node, "--gpu-reset", "-i", "4")
        assert busy.returncode == 255
        assert busy.stdout.startswith(
            "The following GPUs could not be reset:\n  GPU 00000000:9A:00.0: In use by another "
            "client\n\n1 device is currently being used by one or more other processes"
        )
        os.kill(w.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while w.current_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.4)  # well past the release delay: an orphan keeps its memory anyway
        q = ("--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "4")
        assert smi(node, *q).stdout == "9000\n"
        assert smi(node, APP_Q, "--format=csv,noheader", "-i", "4").stdout == ""
        done = smi(node, "--gpu-reset", "-i", "4")
        assert (done.returncode, done.stdout) == (
            0,
            "GPU 00000000:9A:00.0 was successfully reset.\n",
        )
        assert smi(node, *q).stdout == "0\n"
    finally:
        node.release_delay_s = 1.5


@pytest.mark.parametrize("module", [name.removesuffix(".py") for name in STANDALONE])
def test_standalone_parts_import_only_the_standard_library(module: str) -> None:
    path = Path(gpusim.__file__).parent / f"{module}.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            # ``from . import simstate`` or ``from .smi_faults import ...``: copied alongside.
            names = [a.name for a in node.names] if node.module is None else [node.module]
            relative = node.level == 1 and all(f"{n}.py" in STANDALONE for n in names)
            stdlib = node.level == 0 and (node.module or "").split(".")[0] in (
                sys.stdlib_module_names | {"__future__"}
            )
            assert relative or stdlib, f"{module} imports {node.module}"


def test_the_copied_stand_in_runs_with_the_system_python(sim_fleet: SimFleet) -> None:
    node = sim_fleet.node("node4")
    with open(node.nvidia_smi) as f:
        shebang = f.readline()
    assert shebang == f"#!{sim_fleet.python} -S\n"
    if os.access("/usr/bin/python3", os.X_OK):
        assert sim_fleet.python == "/usr/bin/python3"  # one that other users can run
    env = {"PATH": "/usr/bin:/bin"}  # nothing of gpubot's virtual environment
    out = subprocess.run([node.nvidia_smi, "-L"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 8
