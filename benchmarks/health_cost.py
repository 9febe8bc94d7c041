"""The sweep's added cost of the GPU health checks: ``python -m benchmarks.health_cost``.

::

    python -m benchmarks.health_cost --nodes 8 --gpus 8 --repeat 5

One simulated fleet over real SSH (asyncssh, one pooled connection per node). Side by side in one
run, alternating so that the box's load falls on both alike: the sweep as it is without health
checks (``SweepPorts()``) and with them (``SweepPorts(health=HealthChecks)``): every node's probe,
then, with health, the health exec (the health query, ``nvidia-smi nvlink -s``, the fabric
manager's pid file). The nodes are NVSwitch boxes (fabric and 18 links per GPU), so every part of
the exec does its whole work. Figures: the median wall time of a sweep, and of one node's health
exec alone (``--repeat`` x nodes calls), with the CPU the node spent on it (the children's
``getrusage`` of running the same argv here through ``bash``: the simulated nvidia-smi is a Python
program, so its three calls weigh more than the real one's would).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt_ms, table
from gpubot.app import build
from gpubot.config import load
from gpubot.core.health.state import health_argv, parse_health
from gpubot.services.health_checks import HealthChecks
from gpubot.services.sweep import SweepPorts, SweepService
from gpusim import health_faults
from gpusim.fleet import SimFleet


async def _measure(config: Path, repeat: int) -> dict[str, list[float]]:
    settings = load(config)
    app = build(settings, {}, need_store=False)
    health = HealthChecks(app.transport)
    plain = SweepService(settings, app.status, app.transport, SweepPorts())
    checked = SweepService(settings, app.status, app.transport, SweepPorts(health=health))
    out: dict[str, list[float]] = {"plain": [], "health": [], "exec": []}
    try:
        await plain.run(alerting=False)  # connections up before anything is timed
        for _ in range(repeat):
            for name, svc in (("plain", plain), ("health", checked)):
                t0 = time.perf_counter()
                result = await svc.run(alerting=False)
                out[name].append(time.perf_counter() - t0)
                assert not result.failed, result.failed
            for node in settings.nodes:
                t0 = time.perf_counter()
                h = await health.read(node)
                out["exec"].append(time.perf_counter() - t0)
                assert h.field_set == "r535" and h.gpus, h.notes
    finally:
        await app.close()
    return out


def _node_cpu(nvidia_smi: str, fm_pid: str, repeat: int) -> float:
    """Return the median CPU seconds (children: user + system) of one health exec run here."""
    cpu = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = subprocess.run(
            health_argv(nvidia_smi, 5.0, fm_pid=fm_pid), capture_output=True, text=True, check=True
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert parse_health(res.stdout).gpus
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        SimFleet(Path(tmp), nodes=args.nodes, gpus=args.gpus) as fleet,
    ):
        for n in fleet.nodes:
            health_faults.set_node(n, fabric=True, links=18)
        daemons = [health_faults.start_fabric_manager(n) for n in fleet.nodes]
        got = asyncio.run(_measure(fleet.config_path, args.repeat))
        n0 = fleet.nodes[0]
        cpu = _node_cpu(n0.nvidia_smi, n0.fabricmanager_pid, args.repeat)
        for n, w in zip(fleet.nodes, daemons, strict=True):
            health_faults.stop_fabric_manager(n, w)
    plain, checked = statistics.median(got["plain"]), statistics.median(got["health"])
    rows = [
        ["sweep, no health checks", fmt_ms(plain), "", ""],
        [
            "sweep, with health checks",
            fmt_ms(checked),
            fmt_ms(checked - plain),
            f"{checked / plain:.2f}",
        ],
        ["one node's health exec alone", fmt_ms(statistics.median(got["exec"])), "", ""],
        ["its CPU on the node", fmt_ms(cpu), "", ""],
    ]
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs (NVSwitch, 18 links each), median of "
        f"{args.repeat} sweeps each, side by side"
    )
    print(table(["what", "ms", "added ms", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
