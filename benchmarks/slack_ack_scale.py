"""Slack acknowledgements at fleet scale: a burst of signed ``/gpu status all`` during a sweep.

::

    python -m benchmarks.slack_ack_scale                   # 1,000 nodes, 50 requests
    python -m benchmarks.slack_ack_scale --smoke           # 4 nodes, 5 requests

The fleet is ``benchmarks/scale.py``'s: several ``SimFleet``s of asyncssh servers, each in its
own host process, one ``gpubot.toml`` listing every node. The bot is ``gpubot serve --http``,
a real process, its Web API pointed at the loopback fake of Slack (``benchmarks/fake_slack.py``).
Its scheduler starts the first sweep a few seconds after start (cold: it opens every
connection, then probes every node). Once the fleet's host processes have used some CPU since
the bot answered ``/healthz`` (the sweep is under way), ``requests`` signed ``/gpu status all``
leave at once, each on its own connection, and each HTTP 200 is timed: the acknowledgement
Slack waits at most 3 s for. The sweep's count in the bot's metrics right after the last ack
says whether the burst really met the sweep. Then it waits (bounded) for the answers and
scrapes the bot's longest event-loop stall since it started.

Arms over the same fleet, one after the other: the fleet at equal CPU priority, then the fleet
yielding CPU once per ``--shares`` weight (its host processes in a ``cpu`` cgroup of that
``cpu.shares``, 2 by default; without root or that cgroup, ``nice 19``), as on a real
deployment where the nodes' work runs on the nodes. Each arm gets a fresh copy of the migrated
audit database. ``/proc/loadavg`` is read before the burst and after the answers: the box is
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import scale
from benchmarks.common import PYTHON, REPO, FleetYields, percentile, table
from benchmarks.fake_slack import BOT_TOKEN, SECRET, FakeSlack, SlackSender
from benchmarks.slack_ack import _finals, _free_port, _send_burst, _wait_healthy, scrape_stalls

TARGET_P99_S = 0.300
SWEEP_COUNT = "gpubot_sweep_duration_seconds_count"


@dataclass
class ArmResult:
    """One arm: the burst's acks while the bot's sweep ran, and what the bot did meanwhile."""

    label: str
    nodes: int
    requests: int
    yields: str  # how the fleet yields CPU ("" when at equal priority)
    acks: list[float] = field(default_factory=list)  # seconds to each HTTP 200
    bad: list[str] = field(default_factory=list)
    fleet_work_seen: bool = False  # fleet CPU had grown before the burst left
    burst_after_s: float = 0.0  # from /healthz answering to the burst leaving
    sweeps_done_at_last_ack: int | None = None  # 0: the burst met the first sweep
    answered: int = 0
    last_answer_s: float | None = None
    max_stall_s: float | None = None
    stalls_over_50ms: int | None = None
    fleet_cpu_s: float = 0.0  # the fleet's CPU from the burst to the end of the wait
    answer_nodes: list[list[int]] = field(default_factory=list)  # [OK, failing] per answer
    load_before: str = ""
    load_after: str = ""

    def pct(self, p: float) -> float | None:
        """Return the ``p`` percentile (nearest rank) of the ack times."""
        return percentile(self.acks, p) if self.acks else None


def loadavg() -> str:
    """Return ``/proc/loadavg`` as it is."""
    try:
        return Path("/proc/loadavg").read_text(encoding="utf-8").strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def slack_config(inventory: Path, work: Path) -> Path:
    """Return the scale inventory plus a Slack channel and a sweep only at start (hourly)."""
    text = inventory.read_text(encoding="utf-8")
    text += '\n[slack]\nchannel = "C0GENERAL"\n\n[sweep]\ninterval_s = 3600\n'
    path = work / "slack-scale.toml"
    path.write_text(text, encoding="utf-8")
    return path


def fleet_cpu(hosts: Sequence[scale.Child]) -> float:
    """Return the CPU seconds the fleet's host processes and their reaped children used."""
    return sum(h.cpu() for h in hosts)


class Niced:
    """``nice 19`` for the fleet's host processes (what they start later inherits it)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.applied = True
        for pid in self.pids:
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            except OSError:
                self.applied = False

    def close(self) -> None:
        """Back to priority 0 where allowed (root); an unprivileged user keeps 19."""
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, 0)


def make_yield(pids: Sequence[int], shares: int) -> tuple[str, FleetYields | Niced]:
    """Make the fleet yield CPU: a cgroup of ``shares`` (a task's is 1024), else ``nice 19``."""
    group = FleetYields(pids, shares)
    if group.applied:
        return f"cpu cgroup, cpu.shares {shares}", group
    niced = Niced(pids)
    return ("nice 19" if niced.applied else "could not apply"), niced


async def _metric(port: int, name: str) -> int | None:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            for line in (await r.text()).splitlines():
                key, _, value = line.rpartition(" ")
                if key == name:
                    return int(float(value))
    except aiohttp.ClientError:
        return None
    return None


NODES_LINE = re.compile(r"(\d+) OK, (\d+) failing")


def answer_nodes(fake: FakeSlack) -> list[list[int]]:
    """Return ``[OK, failing]`` nodes of every final fleet answer posted (not the placeholder)."""
    out = []
    for call in fake.calls:
        text = json.dumps(call.body, ensure_ascii=False)
        if "⏳" not in text and (m := NODES_LINE.search(text)):
            out.append([int(m.group(1)), int(m.group(2))])
    return out


async def _await_fleet_work(hosts: Sequence[scale.Child], need_s: float, timeout: float) -> bool:
    """Wait until the fleet has used ``need_s`` more CPU (the sweep is under way)."""
    start, deadline = fleet_cpu(hosts), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet_cpu(hosts) - start >= need_s:
            return True
        await asyncio.sleep(0.1)
    return False


async def _start_bot(config: Path, fake: FakeSlack) -> tuple[asyncio.subprocess.Process, int, int]:
    port, metrics_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env.update(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=fake.base_url)
    proc = await asyncio.create_subprocess_exec(
        *(PYTHON, "-m", "gpubot", "--config", str(config), "serve", "--http"),
        *("--port", str(port), "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return proc, port, metrics_port


async def _stop_bot(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)  # our own child, by pid
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def arm(
    config: Path, hosts: Sequence[scale.Child], res: ArmResult, wait_s: float
) -> ArmResult:
    """Start the bot; once its first sweep has the fleet working, send the burst; time acks."""
    fake = FakeSlack()
    await fake.start()
    proc, port, metrics_port = await _start_bot(config, fake)
    try:
        await _wait_healthy(port, proc, 120)
        healthy = time.monotonic()
        need = min(2.0, 0.02 * res.nodes)
        res.fleet_work_seen = await _await_fleet_work(hosts, need, timeout=60)
        res.burst_after_s = time.monotonic() - healthy
        res.load_before = loadavg()
        sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, fake)
        cpu0, started = fleet_cpu(hosts), time.monotonic()
        res.acks, res.bad = await _send_burst(sender, res.requests, "S")
        res.sweeps_done_at_last_ack = await _metric(metrics_port, SWEEP_COUNT)
        left = started + wait_s - time.monotonic()
        with contextlib.suppress(AssertionError):  # not all answered in time: counted below
            await fake.wait_for(lambda: len(_finals(fake)) >= res.requests, timeout=max(0.1, left))
        finals = _finals(fake)
        res.answer_nodes = answer_nodes(fake)
        res.answered = len(finals)
        res.last_answer_s = max(finals) - started if finals else None
        res.max_stall_s, res.stalls_over_50ms = await scrape_stalls(metrics_port)
        res.fleet_cpu_s = fleet_cpu(hosts) - cpu0
        res.load_after = loadavg()
    finally:
        await _stop_bot(proc)
        await fake.stop()
    return res


@dataclass(frozen=True)
class Plan:
    """What to run: the fleet's shape, the burst, how long to wait for the answers."""

    nodes: int
    gpus: int
    procs: int
    every: int
    requests: int
    wait_s: float
    shares: tuple[int, ...] = (2,)  # one yielding arm per cgroup weight


def measure(work: Path, plan: Plan, user: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Start the fleet once; run the equal-priority arm, then the yielding one."""
    out: dict[str, Any] = {"plan": asdict(plan), "load_start": loadavg(), "arms": []}
    with scale.fleet(work, plan.nodes, plan.gpus, user, plan.procs, plan.every, log) as (
        info,
        hosts,
    ):
        out["fleet"] = {k: v for k, v in info.items() if k != "config"}
        config = slack_config(info["config"], work)
        db = work / "gpubot.db"
        pristine = work / "gpubot.db.migrated"
        shutil.copyfile(db, pristine)
        for yields in (0, *plan.shares):
            shutil.copyfile(pristine, db)
            how, undo = "", None
            if yields:
                how, undo = make_yield([h.proc.pid for h in hosts], yields)
            label = f"fleet yields CPU ({how})" if yields else "fleet at equal CPU priority"
            log(
                f"  slack burst: {plan.requests} x /gpu status all over {plan.nodes} nodes, {label}"
            )
            res = ArmResult(label, info["nodes"], plan.requests, how)
            try:
                asyncio.run(arm(config, hosts, res, plan.wait_s))
            finally:
                if undo is not None:
                    undo.close()
            log(f"    {summary(res)}")
            out["arms"].append(res)
    out["load_end"] = loadavg()
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def nodes_in_answers(r: ArmResult) -> str:
    """The OK nodes the fleet answers reported: ``min–max of N``."""
    if not r.answer_nodes:
        return "-"
    ok = [a[0] for a in r.answer_nodes]
    lo, hi = min(ok), max(ok)
    return f"{lo}/{r.nodes}" if lo == hi else f"{lo}–{hi}/{r.nodes}"


def summary(r: ArmResult) -> str:
    """One line of an arm's figures."""
    return (
        f"ack p50/p95/p99/max {_ms(r.pct(50))}/{_ms(r.pct(95))}/{_ms(r.pct(99))}/"
        f"{_ms(r.pct(100))} ms, {len(r.acks)}/{r.requests} HTTP 200, sweeps done at last ack "
        f"{r.sweeps_done_at_last_ack}, answered {r.answered}/{r.requests} (nodes OK "
        f"{nodes_in_answers(r)}), loop stall max {_ms(r.max_stall_s)} ms, "
        f"load {r.load_before} -> {r.load_after}"
    )


def report(out: dict[str, Any]) -> list[str]:
    """Return the Markdown section of one run."""
    arms: list[ArmResult] = out["arms"]
    n = arms[0].nodes if arms else out["plan"]["nodes"]
    rows = []
    for r in arms:
        p99 = r.pct(99)
        verdict = "-" if p99 is None else ("met" if p99 < TARGET_P99_S else "MISSED")
        met_sweep = {None: "?", 0: "yes"}.get(r.sweeps_done_at_last_ack, "no (sweep over)")
        rows.append(
            [
                r.label,
                f"{len(r.acks)}/{r.requests}",
                _ms(r.pct(50)),
                _ms(r.pct(95)),
                _ms(r.pct(99)),
                _ms(r.pct(100)),
                verdict,
                met_sweep,
                f"{r.answered}/{r.requests}",
                nodes_in_answers(r),
                "-" if r.last_answer_s is None else f"{r.last_answer_s:.1f}",
                _ms(r.max_stall_s),
                "-" if r.stalls_over_50ms is None else str(r.stalls_over_50ms),
                f"{r.fleet_cpu_s:.1f}",
                f"`{r.load_before}` → `{r.load_after}`",
            ]
        )
    head = [
        "fleet",
        "HTTP 200",
        "ack p50 ms",
        "ack p95 ms",
        "ack p99 ms",
        "ack max ms",
        f"p99 < {TARGET_P99_S * 1000:.0f} ms",
        "burst met the sweep",
        "answers posted",
        "nodes OK in the answers",
        "last answer s",
        "bot loop stall max ms",
        "stalls > 50 ms",
        "fleet CPU s",
        "/proc/loadavg before burst → after answers",
    ]
    f = out["fleet"]
    return [
        f"### Slack acknowledgement during a sweep at {n} nodes",
        "",
        f"{n} asyncssh nodes × {out['plan']['gpus']} GPUs in {len(f['fleets'])} host processes "
        f"(`benchmarks/scale.py`'s fleet, {f['workloads']} GPU processes); the bot is "
        "`gpubot serve --http` (audit in SQLite); the burst: "
        f"{out['plan']['requests']} signed `/gpu status all` at once, sent once the bot's first "
        "sweep had the fleet working. Load at start `{0}`, at end `{1}`.".format(
            out["load_start"], out["load_end"]
        ),
        "",
        table(head, rows),
        "",
    ]


def main(argv: list[str]) -> int:
    """Run it: ``--nodes 1000 --requests 50`` (``--smoke``: 4 nodes, 5 requests)."""
    from benchmarks.benchuser import bench_user

    p = argparse.ArgumentParser(prog="python -m benchmarks.slack_ack_scale")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--procs", type=int, default=2, help="GPU processes on every --every-th node")
    p.add_argument("--every", type=int, default=8)
    p.add_argument("--wait", type=float, default=300.0, help="how long to wait for answers (s)")
    p.add_argument(
        "--shares", default="2", help="the yielding arms' cgroup cpu.shares, comma separated"
    )
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, help="also write the Markdown here")
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--workdir", type=Path)
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.requests, a.wait = 4, 5, 60.0
    if a.nodes < 1 or a.requests < 1:
        p.error("--nodes and --requests must be at least 1")
    scale.raise_nofile()
    shares = tuple(int(x) for x in a.shares.split(",") if x.strip())
    plan = Plan(a.nodes, a.gpus, a.procs, a.every, a.requests, a.wait, shares)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="gpubot-ack-scale-"))
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with bench_user() as user:
        out = measure(work, plan, user, log)
    text = "\n".join(report(out))
    print(text)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    if a.json:
        raw = {**out, "arms": [asdict(r) for r in out["arms"]]}
        a.json.write_text(json.dumps(raw, indent=1), encoding="utf-8")
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
