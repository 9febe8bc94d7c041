"""A sweep narrowed by a real Prometheus beside the full SSH sweep of the same fleet (issue 38).

::

    python -m benchmarks.prom_sweep                  # 1,000 nodes x 4 GPUs, 20 candidates
    python -m benchmarks.prom_sweep --smoke          # 16 nodes, 2 candidates

The fleet: ``SimFleet``s of at most 64 asyncssh nodes, each in a host process of this module
(``python -m benchmarks.prom_sweep host ...``, as ``benchmarks/scale.py`` does), one inventory.
Each candidate node holds leaked memory on GPU 0 (a job started ``orphan`` and killed): a
finding only SSH can make. Each host counts the commands its nodes' SSH servers ran
(``SimFleet.execs``) and says them on ``execs``: what the nodes saw, not what gpubot sent.

Prometheus is a real one (Debian's ``prometheus``, our child on 127.0.0.1) scraping one text that
serves the corpus's recorded dcgm-exporter sample as every GPU (``gpusim.dcgm_text``, only the
fields the queries read), the candidates' GPU 0 as their nodes hold it (6144 MiB at 0 %), the
rest free as recorded.

The bot is this process: ``gpubot.app.build`` over the inventory (SQLite, migrated), its own
``app.sweep`` (audit record, alert state, idle samples: the scheduler's path,
``alerting=False``; no health exec, and timeouts long enough for the full sweep to hear every
node of this box's simulated fleet). Arms alternate each round: ``full`` (every node's
telemetry ``ssh``) and
``narrowed`` (``prometheus``), each a fresh app sweeping twice: ``cold`` (opens its
connections) and ``warm`` (pooled). Per sweep: wall seconds, this process's CPU (every thread),
the nodes whose servers ran a command, the execs, and the findings, which must be the same in
both arms (the exit status says whether they were, and whether the narrowed sweep asked only
the candidates).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.common import PYTHON, REPO, run_timed, table
from benchmarks.scale import Child, raise_nofile, split, write_inventory
from benchmarks.slack_ack import _free_port as free_port

FIELDS = (
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
)
LEAK_MIB = 6144
# A scrape every second of the 1,000-node text (7 MB) outran its 1 s timeout on a loaded box, each
# failed scrape making every series stale. dcgm-exporter's own interval is 30 s by default.
SCRAPE_S = 5
SAMPLE = REPO / "tests" / "corpus" / "dcgm" / "cncf-upcloud-l40s.prom"  # recorded, verbatim


def _host(directory: str, size: int, gpus: int, user: str, leaks: str) -> int:
    """Serve one ``SimFleet``, leaking memory on GPU 0 of the nodes ``leaks`` lists (local
    indices); answer ``execs`` with each node's count, until EOF or ``quit``."""
    from benchmarks.benchuser import fleet_as
    from gpusim.fleet import SimFleet

    raise_nofile()
    sim = SimFleet(Path(directory), nodes=size, gpus=gpus, release_delay_s=0.3)
    with fleet_as(sim, user or None) as f:
        for i in (int(x) for x in leaks.split(",") if x):
            job = f.nodes[i].spawn(gpu=0, mib=LEAK_MIB, behaviour="orphan", user=user or None)
            os.kill(job.pid, signal.SIGKILL)  # our own workload, by pid: its memory leaks
        served = {
            "user": f.user,
            "client_key": str(f.client_key),
            "known_hosts": str(f.known_hosts),
            "nodes": [
                {
                    "port": n.port,
                    "dev_prefix": n.dev_prefix,
                    "nvidia_smi": n.nvidia_smi,
                    "driver_dir": n.driver_dir,
                }
                for n in f.nodes
            ],
        }
        print(json.dumps(served), flush=True)
        for line in sys.stdin:
            if line.strip() in ("", "quit"):
                break
            counts = f.execs()
            print(json.dumps({"execs": [counts.get(n.name, 0) for n in f.nodes]}), flush=True)
    return 0


@contextmanager
def fleet(
    work: Path, nodes: int, gpus: int, candidates: list[int], user: str | None
) -> Iterator[tuple[Path, list[Child]]]:
    """Start the host processes; yield the migrated inventory and the hosts."""
    hosts: list[Child] = []
    try:
        first = 0
        for i, size in enumerate(split(nodes)):
            d = work / f"fleet-{i + 1}"
            d.mkdir()
            mine = ",".join(str(c - first) for c in candidates if first <= c < first + size)
            argv = ["-m", "benchmarks.prom_sweep", "host", str(d), str(size), str(gpus)]
            hosts.append(Child([PYTHON, *argv, user or "", mine]))
            first += size
        served = [h.answer(600) for h in hosts]
        config = work / "gpubot.toml"
        write_inventory(served, config, work)
        db = run_timed([PYTHON, "-m", "gpubot", "--config", str(config), "db", "upgrade"])
        if db.returncode != 0:
            raise RuntimeError(f"gpubot db upgrade failed: {db.stderr.strip()}")
        yield config, hosts
    finally:
        for h in hosts:
            h.close()


def execs(hosts: list[Child]) -> list[int]:
    return [int(c) for h in hosts for c in h.ask("execs", 60)["execs"]]


async def _sweeps(
    config: Path, url: str, narrowed: bool, hosts: list[Child]
) -> list[dict[str, Any]]:
    """Two sweeps (cold, warm) of a fresh app; the figures of each."""
    from gpubot.app import build
    from gpubot.config import load

    settings = load(config)
    telemetry = "prometheus" if narrowed else "ssh"
    nodes = tuple(dataclasses.replace(n, telemetry=telemetry) for n in settings.nodes)
    prom = dataclasses.replace(settings.prometheus, url=url)
    # Every node's probe runs on this box's 2 cores: the full sweep needs time to hear them all
    # (at the defaults ~140 of 1,000 failed as slow). No health exec: the probe alone, each arm.
    ssh = dataclasses.replace(settings.ssh, command_timeout_s=120.0, connect_timeout_s=60.0)
    sweep = dataclasses.replace(settings.sweep, interval_s=1800.0, budget_s=1500.0, health=False)
    settings = dataclasses.replace(settings, nodes=nodes, prometheus=prom, ssh=ssh, sweep=sweep)
    app = build(settings, {}, need_store=True)
    out = []
    try:
        for label in ("cold", "warm"):
            before = execs(hosts)
            c0, t0 = time.process_time(), time.monotonic()
            result = await app.sweep.run(alerting=False, source="bench")
            wall, cpu = time.monotonic() - t0, time.process_time() - c0
            arm = "narrowed" if narrowed else "full"
            print(f"  {arm} {label}: {wall:.1f} s, {len(result.failed)} failed", file=sys.stderr)
            ran = [a - b for a, b in zip(execs(hosts), before, strict=True)]
            out.append(
                {
                    "arm": arm,
                    "sweep": label,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "asked": [i for i, n in enumerate(ran) if n],
                    "execs": sum(ran),
                    "failed": len(result.failed),
                    "findings": sorted(
                        (f.node, f.gpu, f.kind.value, f.holder) for f in result.findings
                    ),
                    "notes": list(result.notes),
                }
            )
    finally:
        await app.close()
    return out


class Exporter:
    """One text at ``/metrics`` on 127.0.0.1, from a thread of this process."""

    def __init__(self, text: str) -> None:
        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # a scrape cut by its timeout
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read() or b"null")
    except (OSError, ValueError):
        return None


@contextmanager
def prometheus(text: str, work: Path) -> Iterator[str]:
    """A real Prometheus (Debian's ``prometheus``, our child) scraping ``text``; yield its URL
    once it has scraped it."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed: apt-get install prometheus")
    exporter = Exporter(text)
    port = free_port()
    every = f"{SCRAPE_S}s"
    job = {"job_name": "fleet", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
    cfg = {"global": {"scrape_interval": every, "scrape_timeout": every}, "scrape_configs": [job]}
    (work / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
    argv = [
        binary,
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    url = f"http://127.0.0.1:{port}"
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        query = url + "/api/v1/query?query=" + urllib.parse.quote("up")
        while not (
            (doc := _get(query)) and [r for r in doc["data"]["result"] if r["value"][1] == "1"]
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "prometheus.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"prometheus did not scrape the fleet: {tail}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # our own child, by pid
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        exporter.close()


def measure(nodes: int, gpus: int, count: int, rounds: int, user: str | None) -> dict[str, Any]:
    from gpusim.dcgm_text import fleet_text

    candidates = [i * (nodes // count) + nodes // count // 2 for i in range(count)]
    names = [f"node{i + 1}" for i in range(nodes)]
    with tempfile.TemporaryDirectory(prefix="gpubot-prom-sweep-") as tmp:
        t0 = time.monotonic()
        with fleet(Path(tmp), nodes, gpus, candidates, user) as (config, hosts):
            started = time.monotonic() - t0
            print(f"  {nodes} nodes in {len(hosts)} hosts: {started:.0f} s", file=sys.stderr)
            held = {"DCGM_FI_DEV_FB_USED": LEAK_MIB, "DCGM_FI_DEV_GPU_UTIL": 0}
            values = {(names[c], 0): held for c in candidates}
            sample = SAMPLE.read_text(encoding="utf-8")
            gpus_of = dict.fromkeys(names, gpus)
            text = fleet_text(sample, gpus_of, values, added=FIELDS[4:], keep=FIELDS)
            with prometheus(text, Path(tmp)) as url:
                runs = []
                for _ in range(rounds):
                    for narrowed in (False, True):
                        runs += asyncio.run(_sweeps(config, url, narrowed, hosts))
    return {
        "nodes": nodes,
        "gpus": gpus,
        "candidates": candidates,
        "start_s": started,
        "series": len(text.splitlines()),
        "runs": runs,
    }


def checks(r: dict[str, Any]) -> list[str]:
    """What must hold: each narrowed sweep asked the candidates only, every sweep found the
    same, and that is the candidates' leaked memory."""
    want = sorted((f"node{c + 1}", 0, "orphaned-vram", "") for c in r["candidates"])
    bad = []
    for run in r["runs"]:
        if run["findings"] != want or run["failed"]:
            bad.append(
                f"{run['arm']} {run['sweep']}: found {len(run['findings'])}, failed {run['failed']}"
            )
        if run["arm"] == "narrowed" and run["asked"] != r["candidates"]:
            bad.append(
                f"narrowed {run['sweep']}: asked {len(run['asked'])} nodes, not the candidates"
            )
    return bad


def report(r: dict[str, Any]) -> list[str]:
    rows = []
    for arm in ("full", "narrowed"):
        for sweep in ("cold", "warm"):
            mine = [x for x in r["runs"] if x["arm"] == arm and x["sweep"] == sweep]
            wall = sorted(x["wall_s"] for x in mine)[len(mine) // 2]
            cpu = sorted(x["cpu_s"] for x in mine)[len(mine) // 2]
            rows.append(
                [
                    arm,
                    sweep,
                    f"{wall:.2f}",
                    f"{cpu:.2f}",
                    f"{cpu / r['nodes'] * 1000:.2f}",
                    str(max(len(x["asked"]) for x in mine)),
                    str(max(x["execs"] for x in mine)),
                    str(max(len(x["findings"]) for x in mine)),
                ]
            )
    head = ["arm", "sweep", "wall s", "CPU s", "CPU ms/node", "nodes asked", "execs", "findings"]
    bad = checks(r)
    return [
        f"{r['nodes']} nodes x {r['gpus']} GPUs ({r['start_s']:.0f} s to start), "
        f"{len(r['candidates'])} candidates, {r['series']:,} exporter lines a scrape; "
        f"median of {len(r['runs']) // 4} round(s)",
        "",
        table(head, rows),
        "",
        "checks: " + ("passed" if not bad else "; ".join(bad)),
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["host"] and len(argv) == 6:
        return _host(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5])
    p = argparse.ArgumentParser(prog="python -m benchmarks.prom_sweep")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--candidates", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.candidates, a.rounds = 16, 2, 1
    if not 1 <= a.candidates <= a.nodes:
        p.error("--candidates must be between 1 and --nodes")
    raise_nofile()
    from benchmarks.benchuser import bench_user

    with bench_user() as user:
        r = measure(a.nodes, a.gpus, a.candidates, a.rounds, user)
    print("\n".join(report(r)))
    return 0 if not checks(r) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
