"""The store's and the loop's figures at scale, the old code path beside the new one, in one run.

::

    python -m benchmarks.scale_store           # 1,000 nodes (idle, records), 2,000 (stall)
    python -m benchmarks.scale_store --smoke   # tiny: keeps it working

1. **One sweep's idle computation** at ``--nodes`` nodes x 8 GPUs with 1 and 14 days of samples
   kept (flat history: every GPU sampled every sweep, ``--idle-share`` of them held idle the
   whole time; sweeps hourly so that 14 days of 1,000 nodes is 2.7M rows a short run can
   write). Old: ``benchmarks.idle_old`` (rereads every idle GPU's history) then the old keep
   (insert, prune all). New: ``IdleAccounting.sweep`` (the runs, one row per GPU). The first
   new sweep after the upgrade rebuilds the runs from the samples once; it is shown apart.
2. **A sweep's audit record** at ``--nodes`` nodes: the bytes of its payload, old shape
   (every name) and new (a count, a digest, what failed or changed).
3. **The worst event-loop stall during a sweep** at ``--stall-nodes`` nodes: the bot as
   ``gpubot.app.build`` wires it (SQLite), its transport answering every node with one real
   probe answer (``gpusim``'s node, probed once) after a short spread-out delay, so that only the
   bot's side is measured. A 5 ms watch timer records how late it wakes (wall), that minus the
   time the loop's thread waited for a CPU (``/proc/thread-self/schedstat``: the box's load),
   and the CPU the loop's thread itself used between two wake-ups (what a step holds). The old
   path (``fan_out`` with one task per node, parsing and findings on the loop) runs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import table
from benchmarks.idle_old import old_idle

T = TypeVar("T")
GPUS = 8
INTERVAL_S = 3600.0  # hourly sweeps in the generated history (see the docstring)
T0 = 1_900_000_000.0


def cpu_s() -> float:
    """Return this process's CPU seconds (user + system)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def alternate(
    argv: Sequence[str], arms: Sequence[str], rounds: int, pick: Callable[[Any], Any] = lambda x: x
) -> dict[str, Any]:
    """Run ``argv + ["--arm", ARM]`` for each arm in turn, ``rounds`` times, each a process of its
    own (so that one arm's collector or patches never help another, and the box's load falls on
    all alike); each prints a JSON line last. Return ``pick`` of each arm's lines, by arm, in
    order, and the load around each run (``"load"``)."""
    import json

    out: dict[str, Any] = {"load": [], **{a: [] for a in arms}}
    for _ in range(rounds):
        for a in arms:
            before = load()
            p = subprocess.run([*argv, "--arm", a], capture_output=True, text=True, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"arm {a} failed: {p.stderr[-2000:]}")
            out[a].append(pick(json.loads(p.stdout.strip().splitlines()[-1])))
            out["load"].append(f"{a}: {before} → {load()}")
    return out


# ---- 1. the idle computation -------------------------------------------------------------------


def fleet_snaps(nodes: int, idle_share: float, at: float) -> list[Any]:
    """Return one sweep's snapshots: ``idle_share`` of the GPUs held idle by a process."""
    from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot

    out = []
    for n in range(nodes):
        gpus, procs = [], []
        for g in range(GPUS):
            idle = (n * GPUS + g) % round(1 / idle_share) == 0
            gpus.append(GpuInfo(g, f"GPU-{n}-{g}", "H200", 8192, 143771, 0 if idle else 60))
            procs.append(GpuProcess(1000 + g, g, 8192, "python3", True, True, user="u", uid=1000))
        out.append(NodeSnapshot(f"node{n + 1}", at, tuple(gpus), tuple(procs)))
    return out


def fill_history(path: Path, nodes: int, idle_share: float, sweeps: int) -> int:
    """Write ``sweeps`` hourly sweeps of samples straight into the SQLite file; return rows."""
    from gpubot.store.records import text_of

    step = round(1 / idle_share)
    db = sqlite3.connect(path)
    rows = 0
    with db:
        for i in range(sweeps):
            at = text_of(T0 + i * INTERVAL_S)
            batch = [
                (
                    f"node{n + 1}",
                    g,
                    f"GPU-{n}-{g}",
                    at,
                    0 if (n * GPUS + g) % step == 0 else 60,
                    8192,
                )
                for n in range(nodes)
                for g in range(GPUS)
            ]
            db.executemany(
                "INSERT INTO gpu_samples (node, gpu_index, gpu_uuid, taken_at, utilization_pct, "
                "memory_used_mib) VALUES (?, ?, ?, ?, ?, ?)",
                batch,
            )
            rows += len(batch)
    db.close()
    return rows


async def timed(call: Callable[[], Awaitable[T]]) -> tuple[T, float, float]:
    """Return ``call()``'s result, wall seconds and CPU seconds (this process, all threads)."""
    c0, t0 = cpu_s(), time.perf_counter()
    out = await call()
    return out, time.perf_counter() - t0, cpu_s() - c0


async def idle_at(work: Path, nodes: int, days: int, idle_share: float) -> dict[str, Any]:
    """Measure the old and the new idle computation of one sweep over ``days`` of history."""
    from gpubot.core.findings import SweepConfig
    from gpubot.core.reset.protect import Protection
    from gpubot.core.usage.idle import IdleRule
    from gpubot.services.idle_accounting import IdleAccounting
    from gpubot.store import open_store

    path = work / f"idle-{days}d.db"
    url = f"sqlite:///{path}"
    open_store(url).close()  # migrated
    sweeps = days * 24
    t0 = time.perf_counter()
    rows = fill_history(path, nodes, idle_share, sweeps)
    fill_s = time.perf_counter() - t0
    keep = float(days * 86400 + 3600)
    cfg = SweepConfig(interval_s=INTERVAL_S, idle=IdleRule(4096, 4.0, keep))
    store = open_store(url)
    try:
        acct = IdleAccounting(cfg, Protection(), store.samples)
        now = T0 + sweeps * INTERVAL_S
        snaps = fleet_snaps(nodes, idle_share, now)

        async def old() -> dict[tuple[str, int], float]:
            from gpubot.core.usage.idle import samples_of

            found = await old_idle(store.samples, cfg, snaps, now)
            await store.samples.add_samples(samples_of(snaps, now))  # the old keep
            await store.samples.prune_samples(now - keep)
            return found

        want, old_wall, old_cpu = await timed(old)
        with store.engine.begin() as conn:  # take this sweep's samples out again
            conn.exec_driver_sql(f"DELETE FROM gpu_samples WHERE taken_at >= '{iso_of(now)}'")
            conn.exec_driver_sql("DELETE FROM gpu_idle")
        rebuild, k = [], 0
        while True:  # the first sweeps after 0006: runs rebuilt, a bounded batch a sweep
            at = now + INTERVAL_S * k
            s = fleet_snaps(nodes, idle_share, at)
            want_k = await old_idle(store.samples, cfg, s, at)
            times, wall, cpu = await timed(functools.partial(acct.sweep, s, at))
            got = times.gpus
            rebuild.append(wall)
            k += 1
            if got == want_k or k > 20:
                break
        steady = []
        for _ in range(3):
            at = now + INTERVAL_S * k
            s = fleet_snaps(nodes, idle_share, at)
            want_k = await old_idle(store.samples, cfg, s, at)  # the same samples, read back
            times, wall, cpu = await timed(functools.partial(acct.sweep, s, at))
            got = times.gpus
            assert got == want_k, "the runs and the history disagree"
            steady.append((wall, cpu))
            k += 1
    finally:
        store.close()
    wall, cpu = sorted(steady)[1]  # the median of three
    return {
        "days": days,
        "rows": rows,
        "fill_s": fill_s,
        "idle_gpus": len(want),
        "old_wall": old_wall,
        "old_cpu": old_cpu,
        "rebuild_sweeps": len(rebuild),
        "rebuild_max_wall": max(rebuild),
        "new_wall": wall,
        "new_cpu": cpu,
    }


def iso_of(unix: float) -> str:
    from gpubot.store.records import text_of

    return text_of(unix)


# ---- 2. the sweep record -----------------------------------------------------------------------


def record_sizes(nodes: int) -> dict[str, int]:
    """Return the bytes of a sweep record's payload, old shape and new, at ``nodes`` nodes."""
    from gpubot.store.chain import canonical_json
    from gpubot.store.query_records import query_payload

    names = [f"node{i}" for i in range(1, nodes + 1)]
    calm: dict[str, list[str]] = {"added": [], "removed": [], "recovered": []}
    busy = {"added": ["node9999"], "removed": [], "recovered": names[:3]}
    failed = {n: "no answer within the sweep budget (235 s)" for n in names[3:8]}
    return {
        "old": len(canonical_json(query_payload("sweep", names, {}, 61.234, None))),
        "new": len(canonical_json(query_payload("sweep", names, {}, 61.234, calm))),
        "new_5_failed_4_changed": len(
            canonical_json(query_payload("sweep", names, failed, 61.234, busy))
        ),
    }


# ---- 3. the loop stall ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answers:
    """One simulated node's real answers: its probe's and its health exec's."""

    probe: Any
    health: Any
    own: dict[str, Any] = dataclasses.field(default_factory=dict)  # each node's probe answer

    def to(self, argv: Sequence[str], node: str = "node1") -> Any:
        """Return ``node``'s answer to ``argv`` (the health exec names itself in ``$0``)."""
        if list(argv[3:4]) == ["gpubot-health"]:
            return dataclasses.replace(self.health, argv=tuple(argv))
        if node not in self.own:
            self.own[node] = own_answer(self.probe.stdout, node)
        return dataclasses.replace(self.probe, argv=tuple(argv), stdout=self.own[node])


def own_answer(text: str, node: str) -> str:
    """Return the recorded probe answer ``text`` with cgroups of ``node``'s own.

    A fleet's nodes run different jobs, each process in a cgroup of its own, and gpubot
    remembers what it worked out of each cgroup text (``core.probe.fields``): nodes all answering
    one text would make that look free. Each process line's cgroup gets a last path segment
    naming the node and the process.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        f = line.split(" ")
        if f[0] == "p" and len(f) == 12:
            f[10] += ("" if f[10].endswith("/") else "/") + f"bench-{node}-{f[1]}"
            lines[i] = " ".join(f)
    return "\n".join(lines)


def recorded_probe(work: Path) -> tuple[Any, Answers]:
    """Return a node's settings and its real answers (a simulated node, 8 GPUs)."""
    from gpubot.config import load as load_settings
    from gpubot.core.health.state import health_argv
    from gpubot.core.models import CommandResult
    from gpubot.core.probe.snapshot import probe_argv
    from gpusim.fleet import SimFleet

    def run(argv: list[str]) -> CommandResult:
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        return CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr)

    with SimFleet(work / "fleet", nodes=1, gpus=GPUS) as f:
        for g in range(4):
            f.nodes[0].spawn(gpu=g, mib=8192, util_pct=0)
        time.sleep(0.5)
        settings = load_settings(f.config_path)
        node = settings.nodes[0]
        probe = run(probe_argv(node, smi_timeout_s=18.0))
        health = run(health_argv(node.nvidia_smi, 5.0, fm_pid=node.fabricmanager_pid))
    return settings, Answers(probe, health)


class Recorded:
    """A transport that answers every node with the recorded answers, after a delay."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def run(self, node: Any, argv: Sequence[str], *, timeout: float | None = None) -> Any:
        spread = (int(node.name[4:]) * 7919 % 1000) / 1000 * 0.05
        await asyncio.sleep(0.001 + spread)
        return self.answers.to(argv, node.name)

    async def close(self) -> None:
        return None


def recorded_app(
    work: Path, nodes: int, transport: Callable[[Answers], Any] = Recorded
) -> tuple[Any, Answers]:
    """Return gpubot as ``gpubot.app.build`` wires it (SQLite, migrated) over ``nodes`` copies of
    one recorded node, every exec (the probe, the sweep's health exec) through ``transport``."""
    from gpubot.app import build
    from gpubot.store import open_store

    settings, answers = recorded_probe(work)
    one = settings.nodes[0]
    fleet = tuple(dataclasses.replace(one, name=f"node{i + 1}") for i in range(nodes))
    url = f"sqlite:///{work / 'stall.db'}"
    open_store(url).close()
    settings = dataclasses.replace(settings, nodes=fleet, database_url=url)
    app = build(settings, {}, need_store=True)
    t = transport(answers)
    app.transport = app.status.transport = app.sweep.transport = t
    health = getattr(app.sweep, "health", None)  # None before the health checks (a base tree's arm)
    if health is not None:
        health.transport = t
    return app, answers


def runqueue_s() -> float:
    """Return how long this thread has waited for a CPU so far (schedstat; 0 if unknown)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Watch:
    """A 5 ms timer on the loop: how late each wake-up came, and why."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float, float]] = []  # wall late, less CPU wait, loop CPU
        self._task: asyncio.Task[None] | None = None
        self.gc_worst = 0.0  # the longest garbage collection, in any thread
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._task is not None:
            self.gc_worst = max(self.gc_worst, time.perf_counter() - self._gc_start)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0, c0, q0 = loop.time(), time.thread_time(), runqueue_s()
            await asyncio.sleep(0.005)
            late = max(0.0, loop.time() - t0 - 0.005)
            waited = runqueue_s() - q0
            self.ticks.append((late, max(0.0, late - waited), time.thread_time() - c0))

    @contextmanager
    def running(self) -> Iterator[None]:
        self.ticks.clear()
        self.gc_worst = 0.0
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            yield
        finally:
            self._task.cancel()
            self._task = None

    def worst(self) -> tuple[float, float, float]:
        return (
            max((t[0] for t in self.ticks), default=0.0),
            max((t[1] for t in self.ticks), default=0.0),
            max((t[2] for t in self.ticks), default=0.0),
        )


async def old_fan_out(
    nodes: Any, call: Any, limit: int, *, budget_s: Any = None, budget_name: str = "budget"
) -> Any:
    """``fan_out`` before the admission valve: one task per node, all started at once."""
    from gpubot.errors import GpubotError
    from gpubot.services.status import FanOut

    gate = asyncio.Semaphore(max(1, limit))

    async def one(node: Any) -> Any:
        async with gate:
            return await call(node)

    results = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
    ok = {
        n.name: r for n, r in zip(nodes, results, strict=True) if not isinstance(r, BaseException)
    }
    failed = {n.name: r for n, r in zip(nodes, results, strict=True) if isinstance(r, GpubotError)}
    return FanOut(ok, failed)


async def on_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """The old path: the pure work on the loop itself."""
    return fn(*args, **kwargs)


@contextmanager
def old_path() -> Iterator[None]:
    """Put the old fan-out and the old on-loop work back, for the benchmark only."""
    import gpubot.services.idle_accounting as idle_mod
    import gpubot.services.status as status_mod
    import gpubot.services.sweep as sweep_mod

    saved = [
        (m, k, getattr(m, k))
        for m in (status_mod, sweep_mod, idle_mod)
        for k in ("off_loop", "fan_out")
        if hasattr(m, k)
    ]
    for m, k, _ in saved:
        setattr(m, k, on_loop if k == "off_loop" else old_fan_out)
    try:
        yield
    finally:
        for m, k, v in saved:
            setattr(m, k, v)


async def stalls(work: Path, nodes: int, sweeps: int, *, freeze: bool = False) -> dict[str, Any]:
    """Sweep ``nodes`` recorded nodes ``sweeps`` times on each path; return the worst stalls."""
    app, _ = recorded_app(work, nodes)
    if freeze:  # what a long-running server does once started: old objects never rescanned
        gc.freeze()
    watch = Watch()
    out: dict[str, Any] = {"nodes": nodes, "sweeps": sweeps, "freeze": freeze}
    try:
        with watch.running():
            await asyncio.sleep(3.0)
        out["quiet"] = watch.worst()
        for name in ("old", "new"):
            rounds = []
            for _ in range(sweeps):
                with watch.running():
                    t0 = time.perf_counter()
                    res = await (old_run(app) if name == "old" else app.sweep.run(alerting=True))
                    wall = time.perf_counter() - t0
                assert len(res.snapshots) == nodes, res.failed
                rounds.append((*watch.worst(), wall, watch.gc_worst))
            out[name] = rounds
    finally:
        await app.close()
    out["load"] = load()
    return out


async def old_run(app: Any) -> Any:
    with old_path():
        return await app.sweep.run(alerting=True)


# ---- the report ----------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def report(res: dict[str, Any]) -> list[str]:
    """Return the Markdown of one run."""
    lines = [
        f"### Issue 24: idle runs, sweep records, loop stalls (load {res['load_start']} at start)",
        "",
    ]
    rows = [
        [
            f"{r['days']} d ({r['rows']:,} rows)",
            str(r["idle_gpus"]),
            f"{r['old_wall']:.2f} / {r['old_cpu']:.2f}",
            f"{r['new_wall']:.3f} / {r['new_cpu']:.3f}",
            f"{r['old_wall'] / r['new_wall']:.0f}×",
            f"{r['rebuild_sweeps']} sweeps, ≤ {r['rebuild_max_wall']:.2f} s each",
        ]
        for r in res["idle"]
    ]
    if rows:
        lines += [
            f"One sweep's idle computation, {res['nodes']} nodes × {GPUS} GPUs, hourly samples:",
            "",
            table(
                [
                    "history kept",
                    "idle GPUs",
                    "old: wall / CPU s",
                    "new: wall / CPU s",
                    "old / new wall",
                    "after 0006: runs rebuilt in",
                ],
                rows,
            ),
            "",
        ]
    sizes = res["records"]
    lines += [
        f"Sweep audit record at {res['nodes']} nodes: old {sizes['old']:,} bytes; new "
        f"{sizes['new']} bytes (nothing changed), {sizes['new_5_failed_4_changed']} bytes "
        "(5 failed, 1 added, 3 recovered).",
        "",
    ]
    st = res["stall"]
    q = st["quiet"]
    srows = []
    for name in ("old", "new"):
        for i, (late, own, cpu, wall, gcs) in enumerate(st[name], 1):
            srows.append([name, str(i), f"{wall:.2f}", ms(late), ms(own), ms(cpu), ms(gcs)])
    lines += [
        f"Loop stalls during a sweep of {st['nodes']} nodes (recorded probe answers"
        f"{', gc.freeze() after start' if st.get('freeze') else ''}; "
        f"quiet loop before: {ms(q[0])} ms wall, {ms(q[1])} ms less CPU wait; "
        f"load at end {st['load']}):",
        "",
        table(
            [
                "path",
                "sweep",
                "wall s",
                "worst late ms",
                "… less CPU wait ms",
                "worst loop CPU in one tick ms",
                "longest GC ms",
            ],
            srows,
        ),
        "",
    ]
    return lines


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"nodes": a.nodes, "load_start": load(), "idle": []}
    with tempfile.TemporaryDirectory(prefix="gpubot-scale-store-") as tmp:
        work = Path(tmp)
        for days in [] if a.stall_only else a.days:
            print(f"idle: {a.nodes} nodes, {days} d ...", file=sys.stderr)
            res["idle"].append(await idle_at(work, a.nodes, days, a.idle_share))
        res["records"] = record_sizes(a.nodes)
        print(f"stalls: {a.stall_nodes} nodes ...", file=sys.stderr)
        res["stall"] = await stalls(work, a.stall_nodes, a.sweeps, freeze=a.freeze)
    res["load_end"] = load()
    return res


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_store")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--days", default="1,14")
    p.add_argument("--idle-share", type=float, default=0.1)
    p.add_argument("--stall-nodes", type=int, default=2000)
    p.add_argument("--sweeps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument("--stall-only", action="store_true", help="only the loop stalls")
    p.add_argument(
        "--freeze", action="store_true", help="gc.freeze() once the bot is built (not gpubot's)"
    )
    a = p.parse_args(argv)
    a.days = [int(d) for d in a.days.split(",")]
    if a.smoke:
        a.nodes, a.days, a.stall_nodes, a.sweeps = 20, [1, 2], 40, 1
    res = asyncio.run(main_async(a))
    print("\n".join(report(res)))
    print(f"load average at end: {res['load_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
