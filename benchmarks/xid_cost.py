"""The sweep's added cost per node for the kernel-log read: ``python -m benchmarks.xid_cost``.

::

    python -m benchmarks.xid_cost --nodes 8 --gpus 8 --noise 2000 --repeat 5

A simulated fleet over real SSH (asyncssh servers on 127.0.0.1). Each node's kernel log holds
``--noise`` ordinary kernel lines and a few Xid lines per sweep (the stand-in ``journalctl``
answers: ``gpusim.kernlog``). The same ``SweepService`` (no store: probe and findings only)
sweeps the fleet ``--repeat`` times without the watch and, side by side, with it
(``[sweep] kernel_log``): the median sweep wall time of each, their difference per node, and
the read alone (one exec on one node, after its cursor and, for the first read of a process,
the window back), with its output bytes. CPU is this process's (the client side: parsing,
SSH) over the sweeps. The stand-in journalctl is a Python program (about 30 ms to start);
a real ``journalctl -k --after-cursor`` over a small journal is faster, so the read's figure
is an upper bound for a real node's.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt_ms, table
from gpubot.app import build
from gpubot.config import load
from gpubot.core.health.kernlog import kernlog_argv
from gpubot.services.sweep import SweepPorts, SweepService
from gpubot.services.xid_watch import XidWatch
from gpusim.fleet import SimFleet


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _sweeps(fleet: SimFleet, repeat: int, watch: bool) -> tuple[list[float], float]:
    settings = load(fleet.config_path)
    app = build(settings, {}, need_store=False)
    try:
        xid = XidWatch(app.transport) if watch else None
        svc = SweepService(settings, app.status, app.transport, SweepPorts(xid=xid))
        await svc.run(alerting=False)  # warm: connections, and the watch's first read
        walls, cpu0 = [], _cpu()
        for i in range(repeat):
            for n in fleet.nodes:  # new lines since the last sweep
                n.kernel.xid(i % fleet.gpus, 13)
            t0 = time.perf_counter()
            await svc.run(alerting=False)
            walls.append(time.perf_counter() - t0)
        return walls, (_cpu() - cpu0) / repeat
    finally:
        await app.close()


async def _read_alone(fleet: SimFleet, repeat: int) -> tuple[float, float, int, int]:
    """Return the median wall of one read after its cursor, of the first read, and bytes."""
    settings = load(fleet.config_path)
    app = build(settings, {}, need_store=False)
    node = settings.nodes[0]
    try:
        t0 = time.perf_counter()
        first = await app.transport.run(node, kernlog_argv(None, 3600), timeout=30)
        first_s = time.perf_counter() - t0
        cursor = next(
            ln[len("-- cursor: ") :] for ln in first.stdout.splitlines() if ln.startswith("-- c")
        )
        walls, size = [], 0
        for _ in range(repeat):
            fleet.nodes[0].kernel.xid(0, 48)
            t0 = time.perf_counter()
            res = await app.transport.run(node, kernlog_argv(cursor, 3600), timeout=30)
            walls.append(time.perf_counter() - t0)
            size = len(res.stdout.encode())
        return statistics.median(walls), first_s, len(first.stdout.encode()), size
    finally:
        await app.close()


def run(nodes: int, gpus: int, noise: int, repeat: int) -> str:
    """Run the benchmark; return its Markdown report."""
    with tempfile.TemporaryDirectory() as tmp, SimFleet(Path(tmp), nodes=nodes, gpus=gpus) as f:
        for n in f.nodes:
            for i in range(noise):
                n.kernel.write(f"mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE ({i})")
            n.kernel.xid(0, 79)
            n.spawn(gpu=0, mib=2048)
        base, base_cpu = asyncio.run(_sweeps(f, repeat, watch=False))
        with_, with_cpu = asyncio.run(_sweeps(f, repeat, watch=True))
        alone, first, first_bytes, after_bytes = asyncio.run(_read_alone(f, repeat))
    b, w = statistics.median(base), statistics.median(with_)
    rows = [
        ["sweep, no kernel-log read", fmt_ms(b), fmt_ms(base_cpu), "-"],
        ["sweep with the read", fmt_ms(w), fmt_ms(with_cpu), fmt_ms((w - b) / nodes)],
    ]
    head = ["case", "wall ms (median)", "client CPU ms/sweep", "added wall ms per node"]
    out = [
        f"{nodes} nodes x {gpus} GPUs, {noise} other kernel lines a node, {repeat} sweeps each",
        "",
        table(head, rows),
        "",
        table(
            ["the read alone (one node)", "wall ms", "output bytes"],
            [
                ["after its cursor (one new line)", fmt_ms(alone), str(after_bytes)],
                ["first of a process (the window back)", fmt_ms(first), str(first_bytes)],
            ],
        ),
    ]
    return "\n".join(out)


def main() -> None:
    """Parse the options and print the report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--noise", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    print(run(a.nodes, a.gpus, a.noise, a.repeat))


if __name__ == "__main__":
    main()
