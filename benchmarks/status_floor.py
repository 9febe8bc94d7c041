"""A warm ``status all`` of 1,000 nodes over real SSH: gpubot's whole CPU beside the floor's.

::

    python -m benchmarks.status_floor                # 1,000 nodes, 3 rounds of 3 each
    python -m benchmarks.status_floor --stalls       # 2,000 nodes, 2 rounds: the loop's stalls
    python -m benchmarks.status_floor --smoke        # tiny: keeps it working

The fleet is ``benchmarks.ssh_ciphers``'s: one asyncssh server process, a port a node on
127.0.0.1, every exec answered with one real probe answer of a simulated 8-GPU node (the
sweep's health exec with a real health answer), so that what is measured is the client. Two
arms alternate in this process, round after round, over connections opened beforehand:
``floor``, a minimal asyncssh client running gpubot's probe command on every node
(``conn.run``, at most ``[ssh] max_parallel`` at a time, as gpubot runs them), and ``gpubot``,
the bot as ``gpubot.app.build`` wires it (its SSH transport, the audit store in SQLite, the
collector set up as ``serve`` sets it) answering ``status all`` as ``benchmarks/status_cpu.py``
does: the fleet's snapshots, its ``--json`` document and its Slack answer. The figure is this
process's CPU (every thread: the parsing and the store's threads too) per node, the median of
each round's runs.

``--stalls``: a new bot over 2,000 nodes, its first steps one after another (a cold ``status
all``, a warm one, the first sweep over a new database, two more) under
``benchmarks.scale_store.Watch``: the worst lateness of a 5 ms loop timer in each, and that less
the time the loop's thread waited for a CPU (the fleet's server shares this box's 2 cores).
Three arms, each a process of its own with its own fleet, alternating: ``now``; ``all-in``,
every place of ``[ssh] max_parallel`` used from a round's start to its end, whatever the loop's
turns (``core.admission``'s valve off); and ``no-pause``, the pure-work thread running its jobs
without letting the loop in (``offload.JOBS``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import table
from benchmarks.ssh_ciphers import _floor_conn
from benchmarks.ssh_ciphers import run as with_fleet

ARMS = ("floor", "gpubot")


def bot(work: Path, ports: list[int], settings: Any) -> Any:
    """Return gpubot built over the fleet's ports (SQLite audit store, migrated), with the
    recorded node's ``settings`` (its device files are those the answer names)."""
    from gpubot.app import build
    from gpubot.store import open_store

    one, key = settings.nodes[0], str(work / "client_key")
    fleet = tuple(
        dataclasses.replace(one, name=f"node{i}", host="127.0.0.1", port=p, user=None, key=key)
        for i, p in enumerate(ports, 1)
    )
    url = f"sqlite:///{work / 'audit.db'}"
    open_store(url).close()
    ssh = dataclasses.replace(settings.ssh, known_hosts=str(work / "known_hosts"))
    ssh = dataclasses.replace(ssh, connect_timeout_s=60, command_timeout_s=120)
    return build(
        dataclasses.replace(settings, nodes=fleet, database_url=url, ssh=ssh), {}, need_store=True
    )


def serving(app: Any) -> None:
    """Set the collector up as ``serve`` does (``App.running``): the start-up heap frozen, one
    ``SweepHeap`` around sweeps and status rounds."""
    from gpubot.lifecycle import SweepHeap, settle_heap

    settle_heap()
    app.sweep.heap = app.status.heap = SweepHeap().around


async def arms(work: Path, ports: list[int], rounds: int, runs: int, _: int, recorded: Any) -> Any:
    """Run both arms ``rounds`` times, ``runs`` measured runs each after a warm one."""
    from gpubot.chat.fleet_view import render_fleet
    from gpubot.cli.render import fleet_dict
    from gpubot.slack.render import to_slack

    app = bot(work, ports, recorded[0])
    serving(app)
    nodes = app.settings.nodes
    names = [n.name for n in nodes]
    conns = [await _floor_conn(work, n, "gcm") for n in nodes]
    gate = asyncio.Semaphore(app.settings.ssh.max_parallel)
    sent: list[str] = []  # the command gpubot's status sends: the floor sends the same

    async def floor() -> None:
        async def one(conn: Any) -> None:
            async with gate:
                await conn.run(sent[0], encoding=None, check=True)

        await asyncio.gather(*(one(c) for c in conns))

    async def status() -> None:
        res = await app.status.fleet(["all"], actor="bench", source="bench")
        assert len(res.snapshots) == len(nodes), res.failed
        json.dumps(fleet_dict(res, names))
        title = "GPU status · all"
        to_slack(render_fleet(list(res.snapshots), res.failed, seconds=res.seconds, title=title))

    transport = app.status.transport
    plain = transport.run

    async def seen(node: Any, argv: Any, **kw: Any) -> Any:
        sent.append(shlex.join(argv))
        return await plain(node, argv, **kw)

    transport.run = seen
    await status()  # opens every connection
    transport.run = plain
    assert len(set(sent)) == 1, "one command for every node"
    out: dict[str, list[float]] = {a: [] for a in ARMS}
    try:
        for _ in range(rounds):
            for name, call in (("floor", floor), ("gpubot", status)):
                await call()  # warm: connections open, caches filled
                each = []
                for _ in range(runs):
                    c0 = time.process_time()
                    await call()
                    each.append((time.process_time() - c0) / len(nodes) * 1000)
                out[name].append(statistics.median(each))
    finally:
        for c in conns:
            c.close()
        await app.close()
    return out


PHASES = ("cold status", "warm status", "first sweep", "sweep", "sweep")


async def stalls(work: Path, ports: list[int], _r: int, _e: int, _p: int, recorded: Any) -> Any:
    """Run the bot's first steps over the fleet under ``Watch`` (``serve``'s collector set-up):
    a cold ``status all`` (it opens every connection), a warm one, the first sweep
    (a new database: every GPU's first rows) and two more; return each one's worst lateness."""
    from benchmarks.scale_store import Watch

    app = bot(work, ports, recorded[0])
    n = len(app.settings.nodes)
    serving(app)
    watch, out = Watch(), []

    async def status() -> Any:
        return await app.status.fleet(["all"], actor="bench", source="bench")

    async def sweep() -> Any:
        return await app.sweep.run(alerting=True)

    try:
        for phase in PHASES:
            with watch.running():
                t0 = time.perf_counter()
                res = await (status() if "status" in phase else sweep())
                wall = time.perf_counter() - t0
                await asyncio.sleep(0.2)
            late, own, cpu = watch.worst()
            answered = len(res.snapshots)
            out.append({"phase": phase, "wall": wall, "late": late, "own": own, "cpu": cpu})
            out[-1]["answered"] = f"{answered}/{n}"
    finally:
        await app.close()
    return out


# no-pause: the worker never lets the loop in between jobs; all-in: every node a round may
# have in flight from its start to its end, whatever the loop's turns (no ``core.admission``)
STALL_ARMS = ("now", "all-in", "no-pause")


def no_pause() -> None:
    """Run the pure-work thread's jobs without letting the loop in (``services.offload.JOBS``)."""
    from gpubot.core.clock import HandOver
    from gpubot.services import offload

    setattr(offload, "JOBS", HandOver(float("inf")))  # noqa: B010 (a run never that long)


def all_in() -> None:
    """Admit ``[ssh] max_parallel`` nodes in flight from the start, as before the valve."""
    from gpubot.core import admission

    setattr(admission, "FLOOR", 10**6)  # noqa: B010 (over any limit: every place, always)


def stall_rounds(nodes: int, rounds: int) -> dict[str, Any]:
    """Alternate the stall arms' processes (each starts its own fleet) ``rounds`` times."""
    from benchmarks.scale_store import alternate

    argv = [sys.executable, "-m", "benchmarks.status_floor", "--stalls", "--nodes", str(nodes)]
    return {"nodes": nodes, **alternate(argv, STALL_ARMS, rounds)}


def stall_report(res: dict[str, Any]) -> str:
    """Return every round of every arm as a Markdown table."""
    from benchmarks.scale_store import ms

    head = ["arm", "round", "phase", "nodes answered", "wall s", "worst late ms"]
    head += ["… less CPU wait ms", "loop CPU in one tick ms"]
    rows = []
    for arm in STALL_ARMS:
        for r, phases in enumerate(res[arm], 1):
            for p in phases:
                late = [ms(p["late"]), ms(p["own"]), ms(p["cpu"])]
                rows.append([arm, str(r), p["phase"], p["answered"], f"{p['wall']:.1f}", *late])
    title = (
        f"The event loop over {res['nodes']} nodes over SSH, a new bot's first steps, the arms "
        f"alternating (load {'; '.join(res['load'])}):"
    )
    worst = [
        f"- {arm}: worst late {ms(max(p['late'] for r in res[arm] for p in r))} ms, less CPU "
        f"wait {ms(max(p['own'] for r in res[arm] for p in r))} ms"
        for arm in STALL_ARMS
    ]
    return "\n".join([title, "", table(head, rows), "", *worst])


def report(res: dict[str, Any]) -> str:
    """Return the figures as a Markdown table, and the gap."""
    figures = res["arms"]
    med = {a: statistics.median(v) for a, v in figures.items()}
    rows = [[a, " / ".join(f"{x:.3f}" for x in figures[a]), f"{med[a]:.3f}"] for a in ARMS]
    return "\n".join(
        [
            f"warm `status all` of {res['nodes']} nodes over SSH, {res['rounds']} rounds of "
            f"{res['execs']} runs each arm, answers of {res['bytes']:,} bytes",
            "",
            table(["arm", "client CPU ms per node (each round)", "median"], rows),
            "",
            f"- gpubot: {med['gpubot']:.2f} ms of CPU per node; the floor {med['floor']:.2f}; "
            f"gap {med['gpubot'] - med['floor']:+.2f} ms ({med['gpubot'] / med['floor']:.2f}x)",
        ]
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.status_floor")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=3, help="measured runs an arm a round")
    p.add_argument("--stalls", action="store_true", help="the loop's stalls instead (2,000)")
    p.add_argument("--arm", choices=STALL_ARMS, help="with --stalls: one arm here (internal)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.rounds, a.runs = 4, 1, 1
    if a.stalls and a.arm is not None:
        if a.arm == "no-pause":
            no_pause()
        if a.arm == "all-in":
            all_in()
        print(json.dumps(with_fleet(a.nodes, 1, 1, 0, stalls)["arms"]))
        return 0
    if a.stalls:
        nodes = a.nodes if a.smoke or "--nodes" in argv else 2000
        rounds = a.rounds if a.smoke or "--rounds" in argv else 2
        print(stall_report(stall_rounds(nodes, rounds)))
        return 0
    print(report(with_fleet(a.nodes, a.rounds, a.runs, 0, arms)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
