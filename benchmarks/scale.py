"""A running bot over a large simulated fleet, run for real: ``status all`` cold and warm, a sweep.

::

    python -m benchmarks.run --only scale                    # 512 nodes (--scale-nodes)
    python -m benchmarks.run --smoke --only scale            # 16 nodes

The fleet: ``nodes`` simulated nodes x ``gpus`` GPUs, every node its own asyncssh SSH server
(own port, own host key pinned in known_hosts, own state, own nvidia-smi). ``SimFleet`` takes
at most 64 nodes, and one Python process serving 512 nodes' SSH servers and sessions is one GIL
for all of them (handshakes then waited past the bot's 5 s connect timeout while the box was
busy); so the fleet is several ``SimFleet``s of at most 64 nodes, each in its own host process
(``python -m benchmarks.scale host ...``), and the bot sees one ``gpubot.toml`` listing every
node. ``procs`` GPU processes run on every ``every``-th node.

The bot: a separate worker process (``python -m benchmarks.scale worker CONFIG GPUS``) builds
gpubot with ``gpubot.app.build`` (audit store in SQLite, migrated first) and answers one command
per stdin line with a JSON line: ``status`` (``app.status.fleet(["all"])`` rendered both as the
``--json`` document and as the Slack answer; the first one opens every connection) and
``sweep`` (``app.sweep.scheduled()``: the scheduler's path). Each answer carries wall seconds,
the worker's own CPU (``getrusage``), RSS, open descriptors and how many nodes answered (the
failures grouped by reason). Around each command this process also reads the host processes'
CPU (theirs and their reaped children's): the fleet's side (every SSH server, session and remote
command).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CLK_TCK,
    PYTHON,
    REPO,
    open_fds,
    rss_kib,
    run_timed,
    self_cpu,
    table,
)

FLEET_MAX = 64  # SimFleet's own limit on one fleet's nodes
DEFAULT_NODES = 512
SMOKE_NODES = 16
PHASES = (
    ("cold", "status", "cold `status all` (opens every connection)"),
    ("warm", "status", "warm `status all` (pooled connections)"),
    ("sweep", "sweep", "sweep (`app.sweep.scheduled()`, the scheduler's path)"),
)


def raise_nofile() -> tuple[int, int, int]:
    """Raise this process's soft descriptor limit to the hard one; return (old soft, new, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        new = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    soft2, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, soft2, hard


def split(nodes: int) -> list[int]:
    """Return the sizes of the fleets that make ``nodes`` nodes (as even as possible, <= 64)."""
    k = -(-nodes // FLEET_MAX)
    return [nodes // k + (1 if i < nodes % k else 0) for i in range(k)]


# ---- the fleet ---------------------------------------------------------------------------------


class Child:
    """A child process of ours that answers in JSON lines on stdout, read with a timeout."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, bufsize=1
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def answer(self, timeout: float) -> dict[str, Any]:
        """Return the child's next JSON line."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.proc.args!r}: no answer within {timeout:.0f} s") from None
        if not line:
            raise RuntimeError(f"{self.proc.args!r} exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def ask(self, command: str, timeout: float) -> dict[str, Any]:
        """Send ``command``; return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Tell the child to quit; kill it (our own child, by pid) if it does not."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu(self) -> float:
        """Return the CPU seconds the child and the children it reaped used so far."""
        from gpusim.simstate import stat_fields

        f = stat_fields(self.proc.pid)  # utime stime cutime cstime: fields 14-17
        return 0.0 if f is None else sum(int(x) for x in f[11:15]) / CLK_TCK

    def usage(self) -> dict[str, int]:
        """Return the child's RSS (KiB), open descriptors and threads."""
        threads = len(os.listdir(f"/proc/{self.proc.pid}/task"))
        return {
            "rss_kib": rss_kib(self.proc.pid),
            "fds": open_fds(self.proc.pid),
            "threads": threads,
        }


def _host(
    directory: str, size: int, gpus: int, user: str, procs: int, every: int, first: int
) -> int:
    """Serve one ``SimFleet`` (``first``: its first node's index in the whole fleet) until EOF."""
    from benchmarks.benchuser import fleet_as
    from gpusim.fleet import SimFleet

    raise_nofile()
    t0 = time.monotonic()
    sim = SimFleet(Path(directory), nodes=size, gpus=gpus, server="asyncssh")
    with fleet_as(sim, user or None) as f:
        started = time.monotonic() - t0
        spawned = 0
        for i, node in enumerate(f.nodes):
            if (first + i) % every == 0:
                for g in range(min(procs, gpus)):
                    node.spawn(gpu=g, mib=2048 + 1024 * g, user=user or None)
                    spawned += 1
        nodes = [
            {
                "port": n.port,
                "dev_prefix": n.dev_prefix,
                "nvidia_smi": n.nvidia_smi,
                "driver_dir": n.driver_dir,
            }
            for n in f.nodes
        ]
        print(
            json.dumps(
                {
                    "user": f.user,
                    "client_key": str(f.client_key),
                    "nodes": nodes,
                    "known_hosts": str(f.known_hosts),
                    "workloads": spawned,
                    "start_s": started,
                    "spawn_s": time.monotonic() - t0 - started,
                }
            ),
            flush=True,
        )
        while sys.stdin.readline().strip() not in ("", "quit"):
            pass
    return 0


@contextlib.contextmanager
def fleet(
    work: Path,
    nodes: int,
    gpus: int,
    user: str | None,
    procs: int,
    every: int,
    log: Callable[[str], None],
    timeout: float = 600.0,
) -> Iterator[tuple[dict[str, Any], list[Child]]]:
    """Start the fleet's host processes, write one inventory; yield it and the hosts."""
    info: dict[str, Any] = {"fleets": split(nodes)}
    t0 = time.monotonic()
    hosts: list[Child] = []
    try:
        first = 0
        for i, size in enumerate(info["fleets"]):
            d = work / f"fleet-{i + 1}"
            d.mkdir()
            argv = [
                PYTHON,
                "-m",
                "benchmarks.scale",
                "host",
                str(d),
                str(size),
                str(gpus),
                user or "",
                str(procs),
                str(every),
                str(first),
            ]
            hosts.append(Child(argv))
            first += size
        served = [h.answer(timeout) for h in hosts]
        info["start_s"] = time.monotonic() - t0
        info["workloads"] = sum(s["workloads"] for s in served)
        log(
            f"  {nodes} asyncssh nodes in {len(hosts)} host processes, "
            f"{info['workloads']} GPU processes: {info['start_s']:.1f} s"
        )
        config = work / "gpubot.toml"
        write_inventory(served, config, work)
        db = run_timed([PYTHON, "-m", "gpubot", "--config", str(config), "db", "upgrade"])
        if db.returncode != 0:
            raise RuntimeError(f"gpubot db upgrade failed: {db.stderr.strip()}")
        info["config"] = config
        info["nodes"] = sum(len(s["nodes"]) for s in served)
        yield info, hosts
    finally:
        for h in hosts:
            if h.proc.stdin is not None and not h.proc.stdin.closed:
                with contextlib.suppress(OSError):
                    h.proc.stdin.write("quit\n")
                    h.proc.stdin.flush()
        for h in hosts:
            h.close()


def write_inventory(served: list[dict[str, Any]], path: Path, work: Path) -> None:
    """Write one ``gpubot.toml`` (and known_hosts) listing every node of every host."""
    from gpusim.inventory import toml_str as q

    known = work / "known_hosts"
    known.write_text("".join(Path(s["known_hosts"]).read_text() for s in served), "utf-8")
    out = [
        f"# {sum(len(s['nodes']) for s in served)} simulated nodes of {len(served)} fleets "
        "(benchmarks/scale.py).",
        "",
        "[database]",
        f"url = {q('sqlite:///' + str(work / 'gpubot.db'))}",
        "",
        "[ssh]",
        f"known_hosts = {q(str(known))}",
        "",
    ]
    i = 0
    for s in served:
        for n in s["nodes"]:
            i += 1
            out += [
                "[[nodes]]",
                f"name = {q(f'node{i}')}",
                'host = "127.0.0.1"',
                f"port = {n['port']}",
                f"user = {q(s['user'])}",
                f"key = {q(s['client_key'])}",
                f"dev_prefix = {q(n['dev_prefix'])}",
                f"nvidia_smi = {q(n['nvidia_smi'])}",
                f"driver_dir = {q(n['driver_dir'])}",
                f'groups = ["sim", "{"odd" if i % 2 else "even"}"]',
                "",
            ]
    path.write_text("\n".join(out), encoding="utf-8")


# ---- the bot's side: the worker process ---------------------------------------------------------


def _outcome(names: list[str], ok: set[str], failed: dict[str, str]) -> dict[str, Any]:
    """Return how many nodes answered, and the failures grouped by reason (node names cut)."""
    reasons = Counter(
        re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", why.replace(n, "NODE"))
        for n, why in failed.items()
    )
    return {
        "nodes": len(names),
        "answered": len(ok),
        "failed": len(failed),
        "reasons": dict(reasons.most_common(5)),
        "failed_nodes": sorted(failed)[:10],
    }


async def _serve(config: str, gpus: int) -> int:
    nofile = raise_nofile()
    bare = {"rss_kib": rss_kib(), "fds": open_fds()}
    from gpubot.app import build
    from gpubot.chat.fleet_view import render_fleet
    from gpubot.cli.render import fleet_dict
    from gpubot.config import load
    from gpubot.slack.blockkit import limit_problems
    from gpubot.slack.render import to_slack

    settings = load(Path(config))
    app = build(settings, os.environ, need_store=True)
    names = [n.name for n in settings.nodes]

    async def status() -> dict[str, Any]:
        res = await app.status.fleet(["all"], actor="bench", source="bench")
        doc = fleet_dict(res, names)
        json.dumps(doc)
        msg = to_slack(
            render_fleet(
                list(res.snapshots), res.failed, seconds=res.seconds, title="GPU status · all"
            )
        )
        whole = {s.node for s in res.snapshots if len(s.gpus) == gpus}
        out = _outcome(names, whole, dict(res.failed))
        short = [s.node for s in res.snapshots if s.node not in whole]
        out["short"] = short[:10]  # answered, but not with every GPU
        out["blocks"] = len(msg["blocks"])
        out["render_problems"] = limit_problems(msg)
        return out

    async def sweep() -> dict[str, Any]:
        res = await app.sweep.scheduled()
        if res.skipped:
            return {**_outcome(names, set(), {}), "skipped": res.skipped}
        failed = {n: f.reason for n, f in res.failed.items()}
        out = _outcome(names, {s.node for s in res.snapshots}, failed)
        out["findings"] = len(res.findings)
        return out

    commands = {"status": status, "sweep": sweep}
    built = {"rss_kib": rss_kib(), "fds": open_fds()}
    print(json.dumps({"ready": True, "nofile": nofile, "bare": bare, "built": built}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line not in commands:
                return 0
            cpu0, t0 = self_cpu(), time.monotonic()
            out = await commands[line]()
            wall, cpu = time.monotonic() - t0, self_cpu() - cpu0
            out.update(wall=wall, cpu=cpu, rss_kib=rss_kib(), fds=open_fds())
            print(json.dumps(out), flush=True)
    finally:
        await app.close()


# ---- the measurement -----------------------------------------------------------------------------


def measure(
    work: Path,
    nodes: int,
    gpus: int,
    user: str | None,
    procs: int,
    every: int,
    log: Callable[[str], None],
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Start the fleet and the bot; run the phases; return every figure."""
    res: dict[str, Any] = {"gpus": gpus, "procs": procs, "every": every}
    res["cores"] = os.cpu_count() or 1
    res["load_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    log(f"scale: {nodes} nodes x {gpus} GPUs (asyncssh), {procs} GPU process(es) per {every}th")
    with fleet(work, nodes, gpus, user, procs, every, log, timeout) as (info, hosts):
        res["fleet"] = {k: v for k, v in info.items() if k != "config"}
        res["nodes"] = info["nodes"]
        argv = [PYTHON, "-m", "benchmarks.scale", "worker", str(info["config"]), str(gpus)]
        worker = Child(argv)
        try:
            ready = worker.answer(timeout)
            res["ready"] = ready
            res["phases"] = {}
            for key, command, _ in PHASES:
                cpu0 = sum(h.cpu() for h in hosts)
                r = worker.ask(command, timeout)
                r["fleet_cpu"] = sum(h.cpu() for h in hosts) - cpu0
                r["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
                res["phases"][key] = r
                why = f", reasons {r['reasons']}" if r["failed"] else ""
                log(
                    f"  {key:<5} {r['wall']:7.2f} s  bot cpu {r['cpu']:6.2f} s  fleet cpu "
                    f"{r['fleet_cpu']:6.2f} s  answered {r['answered']}/{r['nodes']}{why}"
                )
            res["probe_cpu"] = probe_cpu(info["config"], user)
            usage = [h.usage() for h in hosts]
            res["host"] = {
                "rss_kib": sum(u["rss_kib"] for u in usage),
                "fds": sum(u["fds"] for u in usage),
                "threads": sum(u["threads"] for u in usage),
                "processes": _processes(),
            }
        finally:
            worker.close()
    res["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return res


def probe_cpu(config: Path, user: str | None, runs: int = 5) -> float:
    """Return the median CPU seconds of the probe of node1, run here as the login user, no SSH."""
    import statistics

    from gpubot.config import load
    from gpubot.core.probe.snapshot import probe_argv

    node = load(config).nodes[0]
    cpu = []
    for _ in range(runs):
        proc = subprocess.Popen(
            probe_argv(node, smi_timeout_s=18.0),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            user=user,
        )
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu.append(ru.ru_utime + ru.ru_stime)
    return statistics.median(cpu)


def _processes() -> int:
    """Return how many processes this machine runs (the workloads, everyone's)."""
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


# ---- the report --------------------------------------------------------------------------------


def report(r: dict[str, Any], fitted: dict[str, Any] | None = None) -> list[str]:
    """Return the Markdown section of one scale run (``fitted``: the status part's line fit)."""
    n, ready, phases = r["nodes"], r["ready"], r["phases"]
    cores = r.get("cores") or 1
    rows = [
        [
            "bot started, built, not connected",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            f"{ready['built']['rss_kib'] / 1024:.1f}",
            str(ready["built"]["fds"]),
        ],
    ]
    for key, _, label in PHASES:
        p = phases[key]
        answered = f"{p['answered']}/{p['nodes']}"
        if p.get("skipped"):
            answered = f"skipped: {p['skipped']}"
        rows.append(
            [
                label,
                f"{p['wall']:.2f}",
                answered,
                f"{p['cpu']:.2f}",
                f"{p['cpu'] / n * 1000:.2f}",
                f"{p['fleet_cpu'] / n * 1000:.1f}",
                f"{(p['cpu'] + p['fleet_cpu']) / cores:.1f}",
                f"{p['rss_kib'] / 1024:.1f}",
                str(p["fds"]),
            ]
        )
    f, host = r["fleet"], r["host"]
    soft0, soft, hard = ready["nofile"]
    lines = [
        f"### A running bot over {n} simulated nodes (run, not extrapolated)",
        "",
        f"{n} nodes × {r['gpus']} GPUs, every node its own asyncssh SSH server on 127.0.0.1 "
        f"(own port and pinned host key), served by {len(f['fleets'])} fleet host processes "
        f"(one `SimFleet` of {'/'.join(str(x) for x in sorted(set(f['fleets'])))} nodes each); "
        f"{f['workloads']} GPU processes ({r['procs']} on every {r['every']}th node). The bot "
        "is a separate process built by `gpubot.app.build` (audit in SQLite, default `[ssh]` "
        "settings: `max_parallel = 64`, 5 s connect and 20 s command timeouts). Bot CPU: its "
        "own `getrusage`; fleet CPU: the host processes' (SSH servers, sessions and the "
        "remote commands they ran; /proc/PID/stat with reaped children). Client and fleet "
        f"share this machine's {cores} cores, so wall ≥ (bot + fleet CPU) / {cores}. Load "
        f"average {r['load_start']} at start, {r['load_end']} at end.",
        "",
        table(
            [
                "phase",
                "wall s",
                "nodes answered",
                "bot CPU s",
                "bot CPU ms/node",
                "fleet CPU ms/node",
                f"(bot + fleet CPU) / {cores} cores s",
                "bot RSS after (MiB)",
                "bot fds after",
            ],
            rows,
        ),
        "",
        f"- Bot RSS: {ready['bare']['rss_kib'] / 1024:.1f} MiB bare, "
        f"{ready['built']['rss_kib'] / 1024:.1f} MiB built, "
        f"{phases['cold']['rss_kib'] / 1024:.1f} MiB connected to {n} nodes → "
        f"{(phases['cold']['rss_kib'] - ready['built']['rss_kib']) / n:.0f} KiB per connection; "
        f"fds {ready['built']['fds']} built → {phases['cold']['fds']} connected. Descriptor "
        f"limit: soft {soft0} raised to {soft} (hard {hard}).",
        f"- Fleet: started with its workloads in {f['start_s']:.1f} s; its host processes "
        f"together: RSS {host['rss_kib'] / 1024:.0f} MiB, {host['fds']} fds, "
        f"{host['threads']} threads; {host['processes']} processes on the box. Of the fleet "
        f"CPU, the probe's own remote work is {r['probe_cpu'] * 1000:.0f} ms per node (node1's "
        "probe run here without SSH, median of 5); the rest is the simulated SSH servers "
        "(asyncssh in Python) and their sessions.",
    ]
    for key, _, label in PHASES:
        p = phases[key]
        if p["failed"] or p.get("short"):
            lines.append(
                f"- {label}: {p['failed']} nodes failed ({p['reasons']}; e.g. "
                f"{', '.join(p['failed_nodes'][:5])}), {len(p.get('short', []))} short of GPUs."
            )
    cold = phases["cold"]
    if fitted is not None:
        rss = (fitted["rss_base_kib"] + fitted["rss_per_node_kib"] * n) / 1024
        fds = fitted["fds_base"] + fitted["fds_per_node"] * n
        lines.append(
            f"- The status part's line fit predicts {rss:.0f} MiB and {fds:.0f} fds at {n} "
            f"nodes; measured here: {cold['rss_kib'] / 1024:.0f} MiB and {cold['fds']} fds."
        )
    if "blocks" in cold:
        lines.append(
            f"- The Slack answer of `status all` over {n} nodes: {cold['blocks']} blocks, "
            f"limit problems: {cold['render_problems'] or 'none'}."
        )
    lines.append("")
    return lines


def main(argv: list[str]) -> int:
    """``worker CONFIG GPUS`` (the bot) or ``host DIR SIZE GPUS USER PROCS EVERY FIRST``."""
    if len(argv) == 3 and argv[0] == "worker":
        return asyncio.run(_serve(argv[1], int(argv[2])))
    if len(argv) == 8 and argv[0] == "host":
        d, size, gpus, user, procs, every, first = argv[1:]
        return _host(d, int(size), int(gpus), user, int(procs), int(every), int(first))
    print("usage: run it as python -m benchmarks.run --only scale", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
