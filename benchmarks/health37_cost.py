"""The sweep's added cost per node of issue 37's checks: ``python -m benchmarks.health37_cost``.

::

    python -m benchmarks.health37_cost --nodes 8 --gpus 8 --repeat 7
    python -m benchmarks.health37_cost --smoke     # 2 nodes x 4 GPUs, 2 rounds: seconds

Two parts, each side by side in one run, the arms alternating round by round so that the box's
load falls on both alike:

1. **The health exec** with its PCI section (the NVIDIA display controllers under the node's
   ``pci_dir``, for ``gpu-vanished``) and without it (the same script with the section cut out,
   as the exec was before issue 37), on every simulated node over real SSH (asyncssh, pooled):
   the wall time of one exec. The node's CPU for each is the children's ``getrusage`` of the same
   argv run here. The section alone is timed here too (a ``bash`` running only it, less a
   ``bash`` running nothing), over the simulated node's PCI folder and over a stand-in with
   ``--pci-devices`` devices, about what a real 8-GPU server's ``/sys/bus/pci/devices`` holds.
2. **The sweep's findings step** (``HealthChecks.findings``) with the three checks (hung-but-busy,
   the vanished GPUs, the NVLink expected sets learned and applied) and without them (no hung
   rule; ``find_vanished``, ``expect_links`` and ``learn_links`` cut out for that arm), replayed
   over the same snapshots: those of ``--sweeps`` real looks at the fleet (probe and health exec
   over SSH), a minute apart. Every node has a wedged job (100 %, 90 W of 700 W, flat memory),
   a busy one, NVSwitch links, and node1 a GPU gone from nvidia-smi's list, so every check does
   its whole work; the run checks that the full arm found them and the cut one did not.

The simulated nvidia-smi is a Python program (tens of ms a call), so the exec's absolute time is
larger than a real driver's; the PCI section is bash builtins only (no program started).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from benchmarks.common import fmt_ms, table
from gpubot.app import App, build
from gpubot.config import Settings, load
from gpubot.core.findings import Finding
from gpubot.core.health import findings as health_findings
from gpubot.core.health.hung import HungRule
from gpubot.core.health.state import HEALTH_SCRIPT, NodeHealth, health_argv, parse_health
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.services import health_checks
from gpubot.services.health_checks import HealthChecks
from gpusim import health_faults
from gpusim.fleet import SimFleet

_PCI_START = "if [[ -d $pci ]]; then\n"
_PCI_END = "  m pci 1\nfi\n"
WEDGED_W = 20.0  # the job's share: its GPU draws 70 + 20 = 90 W of its 700 W limit
SWEEP_GAP_S = 60.0


def _pci_section() -> str:
    start = HEALTH_SCRIPT.index(_PCI_START)
    end = HEALTH_SCRIPT.index(_PCI_END, start) + len(_PCI_END)
    return HEALTH_SCRIPT[start:end]


def without_pci(argv: list[str]) -> list[str]:
    """Return the health argv with its PCI section cut out of the script (the exec before)."""
    script = argv[2].replace(_pci_section(), "")
    if script == argv[2] or "$pci" in script:
        raise RuntimeError("the health script's PCI section was not found: update this benchmark")
    return [*argv[:2], script, *argv[3:]]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run_here(argv: Sequence[str]) -> tuple[float, float, str]:
    """Run ``argv`` here; return its wall and CPU seconds and its output."""
    c0, t0 = _children_cpu(), time.perf_counter()
    res = subprocess.run(list(argv), capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, _children_cpu() - c0, res.stdout


def _paired(rounds: int, a: Sequence[str], b: Sequence[str]) -> dict[str, list[float]]:
    """Run ``a`` and ``b`` here ``rounds`` times each, alternating which goes first."""
    out: dict[str, list[float]] = {"a_wall": [], "b_wall": [], "a_cpu": [], "b_cpu": []}
    for r in range(rounds):
        for name, argv in (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a)):
            wall, cpu, _ = _run_here(argv)
            out[f"{name}_wall"].append(wall)
            out[f"{name}_cpu"].append(cpu)
    return out


def fake_pci(folder: Path, devices: int, gpus: int) -> Path:
    """Write a sysfs stand-in of ``devices`` PCI functions, ``gpus`` of them NVIDIA 3D
    controllers, the rest bridges, NICs, NVSwitches and the like (vendor and class only)."""
    others = [("0x8086", "0x060400"), ("0x15b3", "0x020700"), ("0x10de", "0x068000")]
    for i in range(devices):
        vendor, cls = ("0x10de", "0x030200") if i < gpus else others[i % len(others)]
        d = folder / f"0000:{i // 32:02x}:{i % 32:02x}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n", encoding="utf-8")
        (d / "class").write_text(cls + "\n", encoding="utf-8")
    return folder


def section_alone(pci_dir: str, rounds: int, gpus: int) -> tuple[float, float]:
    """Return the PCI section's own median wall and CPU (paired, less an empty bash)."""
    head = "m() { printf '\\n@gpubot %s\\n' \"$*\"; }\npci=$1\n"
    with_ = ["bash", "-c", head + _pci_section() + ":\n", "gpubot-pci", pci_dir]
    empty = ["bash", "-c", head + ":\n", "gpubot-pci", pci_dir]
    listed = _run_here(with_)[2].split("@gpubot pci 0\n", 1)[1].split()
    assert len(listed) == gpus, (pci_dir, listed)  # it did list every GPU, and only those
    got = _paired(rounds, with_, empty)
    wall = statistics.median(a - b for a, b in zip(got["a_wall"], got["b_wall"], strict=True))
    cpu = statistics.median(a - b for a, b in zip(got["a_cpu"], got["b_cpu"], strict=True))
    return wall, cpu


async def exec_over_ssh(app: App, settings: Settings, repeat: int) -> dict[str, list[float]]:
    """Time the health exec with and without the PCI section on every node, alternating."""
    out: dict[str, list[float]] = {"with": [], "without": [], "diff": []}
    for r in range(repeat):
        for node in settings.nodes:
            argv = health_argv(
                node.nvidia_smi, 5.0, fm_pid=node.fabricmanager_pid, pci_dir=node.pci_dir
            )
            arms = [("with", argv), ("without", without_pci(argv))]
            took: dict[str, float] = {}
            for name, a in arms if r % 2 == 0 else arms[::-1]:
                t0 = time.perf_counter()
                res = await app.transport.run(node, a, timeout=30)
                took[name] = time.perf_counter() - t0
                h = parse_health(res.stdout)
                assert h.gpus and (h.pci is not None) == (name == "with"), (name, h.notes)
                out[name].append(took[name])
            out["diff"].append(took["with"] - took["without"])
    return out


Look = tuple[list[NodeSnapshot], dict[str, NodeHealth]]


async def look(app: App, settings: Settings, sweeps: int) -> list[Look]:
    """Return ``sweeps`` looks at the fleet as a sweep takes them: each node's snapshot with
    its health attached, and each node's health as read (its PCI list)."""
    collector = HealthChecks(app.transport, timeout_s=20.0)

    async def one(node: NodeConfig) -> NodeSnapshot:
        return await collector.attach(node, await app.status.snapshot(node))

    out = []
    for _ in range(sweeps):
        snaps = list(await asyncio.gather(*(one(n) for n in settings.nodes)))
        out.append((snaps, dict(collector.last)))
    return out


def _keep_health(node: str, gpus: object, health: NodeHealth, seen: object) -> NodeHealth:
    return health


def _learn_nothing(node: str, gpus: object, health: object, seen: dict[Any, Any]) -> dict[Any, Any]:
    return dict(seen)


def _find_none(snaps: object, pci: object, expected: object, memory: Any) -> tuple[tuple[()], Any]:
    return (), memory


@contextmanager
def cut_checks() -> Iterator[None]:
    """Cut the vanished GPUs and the NVLink expected sets out of the findings step."""
    cuts: list[tuple[object, str, object]] = [
        (health_findings, "expect_links", _keep_health),
        (health_findings, "learn_links", _learn_nothing),
        (health_checks, "find_vanished", _find_none),
    ]
    saved = [(m, name, getattr(m, name)) for m, name, _ in cuts]
    for m, name, stand_in in cuts:
        setattr(m, name, stand_in)
    try:
        yield
    finally:
        for m, name, real in saved:
            setattr(m, name, real)


async def replay(
    app: App, looks: list[Look], expected: dict[str, int], full: bool
) -> tuple[float, float, tuple[Finding, ...], HealthChecks]:
    """Run the findings step over ``looks`` from a fresh memory; return its CPU and wall seconds
    (all looks), the last look's findings and the checks."""
    hung = HungRule(3) if full else None
    checks = HealthChecks(app.transport, gpus=expected if full else {}, hung=hung)
    cpu = wall = 0.0
    found: tuple[Finding, ...] = ()
    with nullcontext() if full else cut_checks():
        for i, (snaps, last) in enumerate(looks):
            checks.last = last
            c0, t0 = time.process_time(), time.perf_counter()
            found = await checks.findings(snaps, advance=True, at=1e9 + SWEEP_GAP_S * i)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
    return cpu, wall, found, checks


def _kinds(found: tuple[Finding, ...]) -> set[tuple[str, str]]:
    return {(f.node, f.kind.value) for f in found}


async def findings_step(
    app: App, settings: Settings, sweeps: int, repeat: int, expected: dict[str, int]
) -> dict[str, list[float]]:
    """Replay the fleet's looks through the findings step, the arms alternating."""
    looks = await look(app, settings, sweeps)
    per = float(sweeps * len(settings.nodes))
    out: dict[str, list[float]] = {f"{a}_{m}": [] for a in ("full", "cut") for m in ("cpu", "wall")}
    for r in range(repeat):
        for full in (True, False) if r % 2 == 0 else (False, True):
            cpu, wall, found, checks = await replay(app, looks, expected, full)
            arm = "full" if full else "cut"
            out[f"{arm}_cpu"].append(cpu / per)
            out[f"{arm}_wall"].append(wall / per)
            kinds = _kinds(found)
            hung = {(n.name, "hung-busy") for n in settings.nodes}
            vanished = ("node1", "gpu-vanished")
            if full:  # every check did its work: else the figures would mean nothing
                assert hung <= kinds and vanished in kinds, kinds
                assert checks.memory.links, "no NVLink link was learned"
            else:
                assert not hung & kinds and vanished not in kinds, kinds
                assert not checks.memory.links
    return out


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def _box() -> str:
    load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load1}"


def run(nodes: int, gpus: int, repeat: int, sweeps: int, pci_devices: int) -> str:
    """Run both parts; return the Markdown report."""
    if nodes < 2 or gpus < 3:
        raise SystemExit("health37_cost: needs --nodes >= 2 and --gpus >= 3")
    box_before = _box()
    with (
        tempfile.TemporaryDirectory() as tmp,
        SimFleet(Path(tmp) / "fleet", nodes=nodes, gpus=gpus, people=("alice", "bob")) as fleet,
    ):
        daemons = []
        for n in fleet.nodes:
            health_faults.set_node(n, fabric=True, links=18)
            daemons.append(health_faults.start_fabric_manager(n))
            wedged = n.spawn(gpu=0, mib=30000, util_pct=100, user="alice")
            health_faults.set_workload(n, wedged, power_w=WEDGED_W)
            n.spawn(gpu=1, mib=30000, util_pct=100, user="bob")
        health_faults.vanish(fleet.node("node1"), gpus - 1, from_pci=False)
        settings = load(fleet.config_path)
        expected = {n.name: gpus for n in settings.nodes}

        async def both() -> tuple[dict[str, list[float]], dict[str, list[float]]]:
            app = build(settings, {}, need_store=False)
            try:
                ssh = await exec_over_ssh(app, settings, repeat)
                step = await findings_step(app, settings, sweeps, repeat, expected)
                return ssh, step
            finally:
                await app.close()

        ssh, step = asyncio.run(both())
        n0 = settings.nodes[0]
        argv = health_argv(n0.nvidia_smi, 5.0, fm_pid=n0.fabricmanager_pid, pci_dir=n0.pci_dir)
        here = _paired(repeat * 2, argv, without_pci(argv))
        sim_pci = len(os.listdir(n0.pci_dir))
        alone_sim = section_alone(n0.pci_dir, repeat * 4, gpus)
        big = fake_pci(Path(tmp) / "pci", pci_devices, gpus)
        alone_big = section_alone(str(big), repeat * 4, gpus)
        for n, fm in zip(fleet.nodes, daemons, strict=True):
            health_faults.stop_fabric_manager(n, fm)
    w, wo = _med(ssh["with"]), _med(ssh["without"])
    cw, cwo = _med(here["a_cpu"]), _med(here["b_cpu"])
    exec_rows = [
        ["health exec without the PCI section", fmt_ms(wo), "", "", fmt_ms(cwo), ""],
        [
            "health exec with it",
            fmt_ms(w),
            fmt_ms(_med(ssh["diff"])),
            f"{w / wo:.2f}",
            fmt_ms(cw),
            fmt_ms(cw - cwo),
        ],
    ]
    alone_rows = [
        [f"the simulated node's ({sim_pci} devices, {gpus} GPUs)", *map(fmt_ms, alone_sim)],
        [f"a stand-in of {pci_devices} devices ({gpus} GPUs)", *map(fmt_ms, alone_big)],
    ]
    fc, fw = _med(step["full_cpu"]), _med(step["full_wall"])
    cc, cwl = _med(step["cut_cpu"]), _med(step["cut_wall"])
    step_rows = [
        ["without hung / vanished / NVLink sets", f"{cc * 1e3:.3f}", f"{cwl * 1e3:.3f}", "", ""],
        [
            "with them",
            f"{fc * 1e3:.3f}",
            f"{fw * 1e3:.3f}",
            f"{(fc - cc) * 1e3:.3f}",
            f"{(fw - cwl) * 1e3:.3f}",
        ],
    ]
    return "\n".join(
        [
            f"{nodes} nodes x {gpus} GPUs (NVSwitch, 18 links each; a wedged and a busy job a node,"
            f" one GPU gone from nvidia-smi on node1); {repeat} rounds, arms alternating.",
            f"Box: {box_before} at start, {_box()} at end.",
            "",
            f"One node's health exec over SSH (median of {repeat} x {nodes}; added: median of the"
            f" pairs) and its CPU on the node (run here, median of {repeat * 2}):",
            "",
            table(
                ["exec", "wall ms", "added wall ms", "ratio", "node CPU ms", "added CPU ms"],
                exec_rows,
            ),
            "",
            f"The PCI section alone, run here (median of {repeat * 4} pairs, less an empty bash):",
            "",
            table(["PCI folder", "wall ms", "CPU ms"], alone_rows),
            "",
            f"The sweep's findings step, per node per sweep, replayed over {sweeps} looks "
            f"(median of {repeat} replays each):",
            "",
            table(
                ["findings step", "CPU ms/node", "wall ms/node", "added CPU", "added wall"],
                step_rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the options and print the report."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sweeps", type=int, default=4, help="looks replayed (hung needs 3)")
    ap.add_argument("--pci-devices", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="2 nodes x 4 GPUs, 2 rounds")
    a = ap.parse_args(argv)
    if a.smoke:
        a.nodes, a.gpus, a.repeat, a.sweeps, a.pci_devices = 2, 4, 2, 3, 32
    if a.sweeps < 3:
        ap.error("--sweeps must be at least 3: a hung holder is found at its third look")
    print(run(a.nodes, a.gpus, a.repeat, a.sweeps, a.pci_devices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
