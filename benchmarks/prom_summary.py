"""The fleet summary from a real Prometheus beside the SSH fan-out of the same summary (issue 38).

::

    python -m benchmarks.prom_summary                    # 2,500 nodes × 8 GPUs, both arms
    python -m benchmarks.prom_summary --ssh-nodes 1000   # the SSH arm over fewer nodes
    python -m benchmarks.prom_summary --profile          # also where the Prometheus arm's time goes
    python -m benchmarks.prom_summary --smoke            # tiny: keeps it working

``prometheus``: the bot (``gpubot.app.build``, SQLite audit store) with every node's telemetry
"prometheus", answering ``status all --summary`` from the real Prometheus of
``benchmarks.prom_fleet`` (``--nodes`` × 8 GPUs of dcgm-exporter series, every family of a
recorded sample): ``StatusService.summary``, the CLI's text (``render_summary``), its ``--json``
document and the Slack answer (``FleetRenders``, as ``/gpu status all`` posts it). ``ssh``: the
same bot with every node's telemetry "ssh", the same calls, over ``benchmarks.ssh_ciphers``'s
fleet (one asyncssh server process, a port a node, each exec answered with a recorded probe
answer of an 8-GPU node), its connections opened by a first run. The arms alternate round after
round in one process; the figures are each round's median wall time, this process's CPU per node
(every thread), and for the Prometheus arm the server's own CPU per node beside it (it shares
this box's cores).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, table
from benchmarks.prom_fleet import Running, node_name, prometheus
from benchmarks.ssh_ciphers import run as with_fleet
from benchmarks.status_floor import serving

ARMS = ("prometheus", "ssh")
GPUS = 8


def bot(work: Path, ports: list[int], settings: Any, nodes: int, prom: str | None) -> Any:
    """Return gpubot over ``nodes`` nodes (``node{i}``, the SSH fleet's ports in turn), each
    one's telemetry "prometheus" from ``prom`` where given, else "ssh"."""
    from gpubot.app import build
    from gpubot.core.telemetry import PROMETHEUS, SSH
    from gpubot.store import open_store

    one, key = settings.nodes[0], str(work / "client_key")
    telemetry = SSH if prom is None else PROMETHEUS
    fleet = tuple(
        dataclasses.replace(
            one,
            name=node_name(i),
            host="127.0.0.1",
            port=ports[(i - 1) % len(ports)],
            user=None,
            key=key,
            telemetry=telemetry,
        )
        for i in range(1, nodes + 1)
    )
    url = f"sqlite:///{work / f'audit-{telemetry}.db'}"
    open_store(url).close()
    ssh = dataclasses.replace(settings.ssh, known_hosts=str(work / "known_hosts"))
    ssh = dataclasses.replace(ssh, connect_timeout_s=60, command_timeout_s=120)
    cfg = dataclasses.replace(settings.prometheus, url=prom, timeout_s=60.0)
    built = dataclasses.replace(settings, nodes=fleet, database_url=url, ssh=ssh, prometheus=cfg)
    return build(built, {}, need_store=True)


async def answer(app: Any, order: list[str]) -> Any:
    """``status all --summary`` as the CLI prints it, its ``--json`` and Slack's answer."""
    from gpubot.chat.fleet_view import FleetRenders
    from gpubot.cli.render import fleet_dict, render_summary
    from gpubot.slack.render import to_slack

    res = await app.status.summary(["all"], actor="bench", source="bench")
    render_summary(res, order)
    json.dumps(fleet_dict(res, order))
    to_slack(FleetRenders().fleet(res, "GPU status · all"))
    return res


def check(arm: str, res: Any, nodes: int) -> None:
    """Every node answered by the arm's own path (none fell back, none failed)."""
    if arm == "prometheus":
        gpus = sum(len(n.gpus) for n in res.telemetry)
        ok = len(res.telemetry) == nodes and gpus == nodes * GPUS and not res.snapshots
    else:
        ok = len(res.snapshots) == nodes and not res.telemetry
    if not ok or res.failed or res.notes:
        raise SystemExit(f"{arm}: not every node answered: {res.failed or res.notes}")


async def arms(
    work: Path, ports: list[int], rounds: int, runs: int, recorded: Any, prom: Running, n: int
) -> dict[str, Any]:
    """Alternate the arms ``rounds`` times, ``runs`` measured runs each after a warm one, each
    timed between two of Prometheus's scrapes."""
    apps = {
        "prometheus": bot(work, ports, recorded[0], n, prom.url),
        "ssh": bot(work, ports, recorded[0], len(ports), None),
    }
    sizes = {"prometheus": n, "ssh": len(ports)}
    out: dict[str, Any] = {a: {"wall": [], "cpu": [], "server": []} for a in ARMS}
    try:
        for app in apps.values():
            serving(app)
        for _ in range(rounds):
            for arm in ARMS:
                app, size = apps[arm], sizes[arm]
                order = [x.name for x in app.settings.nodes]
                check(arm, await answer(app, order), size)  # warm: connections, caches
                walls, cpus, server = [], [], []
                for _ in range(runs):
                    prom.between_scrapes(15.0)  # both arms: a scrape is not theirs
                    s0, c0, t0 = prom.cpu_s(), time.process_time(), time.perf_counter()
                    res = await answer(app, order)
                    walls.append(time.perf_counter() - t0)
                    cpus.append((time.process_time() - c0) / size * 1000)
                    server.append((prom.cpu_s() - s0) / size * 1000)
                    check(arm, res, size)
                out[arm]["wall"].append(statistics.median(walls))
                out[arm]["cpu"].append(statistics.median(cpus))
                out[arm]["server"].append(statistics.median(server))
    finally:
        for app in apps.values():
            await app.close()
    out["scrape"] = prom.scrape()
    return out


def measure(nodes: int, ssh_nodes: int, rounds: int, runs: int, interval_s: int) -> Any:
    """Start Prometheus over ``nodes`` nodes and the SSH fleet of ``ssh_nodes``; run the arms."""
    with (
        tempfile.TemporaryDirectory(prefix="gpubot-prom-bench-") as tmp,
        prometheus(Path(tmp), nodes, GPUS, interval_s) as prom,
    ):

        async def both(work: Path, ports: list[int], r: int, x: int, _: int, rec: Any) -> Any:
            return await arms(work, ports, r, x, rec, prom, nodes)

        res = with_fleet(ssh_nodes, rounds, runs, 0, both)
        res["series"] = prom.series
    return res | {"prom_nodes": nodes, "interval_s": interval_s}


def report(res: dict[str, Any]) -> str:
    """Return the figures as a Markdown table, and the ratios."""
    arms_ = res["arms"]
    sizes = {"prometheus": res["prom_nodes"], "ssh": res["nodes"]}
    rows, med = [], {}
    for arm in ARMS:
        r = arms_[arm]
        med[arm] = {k: statistics.median(r[k]) for k in ("wall", "cpu", "server")}
        server = " / ".join(f"{x:.3f}" for x in r["server"]) if arm == "prometheus" else "–"
        rows.append(
            [
                arm,
                f"{sizes[arm]:,} × {GPUS}",
                " / ".join(f"{x:.2f}" for x in r["wall"]),
                " / ".join(f"{x:.3f}" for x in r["cpu"]),
                server,
            ]
        )
    head = [
        "arm",
        "nodes × GPUs",
        "wall s (each round)",
        "gpubot CPU ms/node",
        "Prometheus CPU ms/node",
    ]
    p, s, sc = med["prometheus"], med["ssh"], arms_["scrape"]
    return "\n".join(
        [
            f"`status all --summary` (CLI text, `--json`, Slack answer), {res['rounds']} rounds of "
            f"{res['execs']} runs an arm; Prometheus holds {res['series']:,} series, scraped "
            f"every {res['interval_s']} s (the last scrape took {sc['duration_s']:.1f} s)",
            "",
            table(head, rows),
            "",
            f"- Prometheus: {p['wall']:.2f} s for {sizes['prometheus'] * GPUS:,} GPUs "
            f"(target ≤ 2 s: {'met' if p['wall'] <= 2 else 'missed'}); gpubot "
            f"{p['cpu']:.3f} ms CPU a node, Prometheus {p['server']:.3f} ms",
            f"- SSH: {s['wall']:.2f} s for {sizes['ssh'] * GPUS:,} GPUs; gpubot {s['cpu']:.3f} ms "
            f"CPU a node ({s['cpu'] / p['cpu']:.1f}× the Prometheus arm's)",
        ]
    )


async def phases(prom: Running, nodes: int, repeat: int) -> dict[str, float]:
    """Where the Prometheus arm's time goes, each part alone, medians of ``repeat``: the
    queries' HTTP answers (wall, bytes not decoded), their JSON decode, the fold
    (``summarize``), the renderings."""
    import aiohttp

    from gpubot.chat.fleet_view import FleetRenders
    from gpubot.cli.render import fleet_dict, render_summary
    from gpubot.core.telemetry import PromLabels, queries, summarize
    from gpubot.services.status import FleetStatus
    from gpubot.slack.render import to_slack

    asked = queries(PromLabels())
    got: dict[str, list[float]] = {k: [] for k in ("http", "decode", "fold", "render", "bytes")}
    async with aiohttp.ClientSession() as session:

        async def one(q: str) -> bytes:
            async with session.get(prom.url + "/api/v1/query", params={"query": q}) as resp:
                return await resp.read()

        for _ in range(repeat):
            prom.between_scrapes(5.0)
            t0 = time.perf_counter()
            bodies = await asyncio.gather(*(one(q) for q in asked.values()))
            got["http"].append(time.perf_counter() - t0)
            got["bytes"].append(sum(len(b) for b in bodies))
            c0 = time.process_time()
            docs = [json.loads(b)["data"]["result"] for b in bodies]
            got["decode"].append(time.process_time() - c0)
            c0 = time.process_time()
            found = summarize(dict(zip(asked, docs, strict=True)), PromLabels())
            got["fold"].append(time.process_time() - c0)
            assert len(found) == nodes
            status = FleetStatus((), telemetry=tuple(found.values()))
            order = list(found)
            c0 = time.process_time()
            render_summary(status, order)
            json.dumps(fleet_dict(status, order))
            to_slack(FleetRenders().fleet(status, "GPU status · all"))
            got["render"].append(time.process_time() - c0)
    return {k: statistics.median(v) for k, v in got.items()} | {"queries": len(asked)}


def profile(nodes: int, interval_s: int, repeat: int) -> str:
    with (
        tempfile.TemporaryDirectory(prefix="gpubot-prom-profile-") as tmp,
        prometheus(Path(tmp), nodes, GPUS, interval_s) as prom,
    ):
        p = asyncio.run(phases(prom, nodes, repeat))
    return (
        f"The Prometheus arm's parts at {nodes:,} nodes, medians of {repeat}: {p['queries']:.0f} "
        f"queries answered (HTTP, at once) {p['http']:.2f} s wall, {p['bytes'] / 2**20:.1f} MiB; "
        f"JSON decode {p['decode']:.2f} s CPU; fold {p['fold']:.2f} s CPU; renderings "
        f"{p['render']:.2f} s CPU"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prom_summary")
    p.add_argument("--nodes", type=int, default=2500, help="nodes Prometheus holds (8 GPUs each)")
    p.add_argument("--ssh-nodes", type=int, help="nodes of the SSH arm (default: --nodes)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=3, help="measured runs an arm a round")
    p.add_argument("--interval", type=int, default=30, help="Prometheus's scrape interval (s)")
    p.add_argument("--profile", action="store_true", help="where the Prometheus arm's time goes")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument("--json", help="also write the raw figures here")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.ssh_nodes, a.rounds, a.runs, a.interval = 6, 4, 1, 1, 2
    if a.profile:
        print(profile(a.nodes, a.interval, 5 if not a.smoke else 1))
        return 0
    started = " ".join(f"{x}" for x in machine().values())
    res = measure(a.nodes, a.ssh_nodes or a.nodes, a.rounds, a.runs, a.interval)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(report(res) + f"\n\nMachine at start: {started}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
