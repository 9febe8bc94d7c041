"""The first sweep of 2,000 nodes: the store's statements and the loop, side by side.

::

    python -m benchmarks.first_sweep                 # 2,000 nodes, 2 rounds of the 3 arms
    python -m benchmarks.first_sweep --smoke         # tiny: keeps it working

A bot's first sweep over a new database writes every GPU's first rows: 16,000 idle runs (each
rebuilt from the GPU's kept samples, none yet) and 32,000 ECC counts at 2,000 nodes. The bot is
``benchmarks.scale_store.recorded_app`` (SQLite, every node one recorded real answer) with
``serve``'s collector set-up; each arm is a process of its own and the arms alternate. ``old``:
the store as before (a statement built per GPU and per ECC row, and no hand-over); ``batched``:
statements built once (bound values, one batched ECC upsert), no hand-over; ``now``: that and
``store.waits.STATEMENTS``. Per sweep: the worst lateness of a 5 ms loop timer (``Watch``), and
the store thread's CPU in its two biggest calls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import table
from benchmarks.scale_store import Watch, alternate, ms, recorded_app

ARMS = ("old", "batched", "now")
ARGV = (sys.executable, "-m", "benchmarks.first_sweep")
CALLS = ("DbSamples._advance", "DbEcc._put")


def old_store() -> None:
    """Put back the store's statements as they were before this benchmark (built per row)."""
    from sqlalchemy import Connection, delete, func, select

    from gpubot.core.usage.idle import GpuKey
    from gpubot.core.usage.idle_runs import RunRule
    from gpubot.store import health, idle_runs
    from gpubot.store.engine import guard, write_tx
    from gpubot.store.records import text_of, unix_of
    from gpubot.store.tables import gpu_ecc as e
    from gpubot.store.tables import gpu_samples as t

    def first_kept(conn: Connection, key: GpuKey, keep_from: float) -> float | None:
        node, gpu, uuid = key
        q = select(func.min(t.c.taken_at)).where(
            t.c.node == node,
            t.c.gpu_index == gpu,
            t.c.gpu_uuid == uuid,
            t.c.taken_at >= text_of(keep_from),
        )
        first = conn.execute(q).scalar()
        return None if first is None else unix_of(str(first))

    def walk_back(
        conn: Connection, key: GpuKey, rule: RunRule, keep_from: float, below: float | None
    ) -> tuple[float | None, float | None, int]:
        node, gpu, uuid = key
        q = select(t.c.taken_at, t.c.utilization_pct, t.c.memory_used_mib).where(
            t.c.node == node,
            t.c.gpu_index == gpu,
            t.c.gpu_uuid == uuid,
            t.c.taken_at >= text_of(keep_from),
        )
        if below is not None:
            q = q.where(t.c.taken_at < text_of(below))
        q = q.order_by(t.c.taken_at.desc(), t.c.id)
        top: float | None = None
        since: float | None = None
        rows = 0
        result = conn.execute(q.execution_options(yield_per=256))
        try:
            for at_text, util, mem in result:
                rows += 1
                at = unix_of(at_text)
                top = at if top is None else top
                idle = util == 0 and mem is not None and mem >= rule.min_mib
                if not idle or (since is not None and since - at > rule.max_gap_s):
                    break
                since = at
        finally:
            result.close()
        return top, since, rows

    def put(self: Any, counts: dict[Any, Any]) -> None:
        rows = [
            {"node": k[0], "gpu_uuid": k[1], "counter": k[2], "count": v.count}
            | {"grew_from": v.grew_from, "sweeps_since": v.sweeps_since}
            for k, v in sorted(counts.items())
        ]
        with guard("cannot record ECC counts"), write_tx(self._engine) as conn:
            for r in rows:
                conn.execute(
                    delete(e).where(
                        e.c.node == r["node"],
                        e.c.gpu_uuid == r["gpu_uuid"],
                        e.c.counter == r["counter"],
                    )
                )
            conn.execute(e.insert(), rows)

    put.__qualname__ = "DbEcc._put"  # counted as the call it stands in for
    setattr(idle_runs, "_first_kept", first_kept)  # noqa: B010 (a benchmark's patch)
    setattr(idle_runs, "_walk_back", walk_back)  # noqa: B010
    setattr(health.DbEcc, "_put", put)  # noqa: B010


def no_hand_over() -> None:
    """Let the store's threads run statements without letting the loop in (``store.waits``)."""
    import gpubot.store.engine as engine
    from gpubot.core.clock import HandOver

    setattr(engine, "STATEMENTS", HandOver(float("inf")))  # noqa: B010 (a run never that long)


def timed_store(cpu: collections.defaultdict[str, float]) -> None:
    """Count the store thread's CPU in each call by name (every module's ``in_thread``)."""
    from gpubot.store import waits

    plain = waits.in_thread

    async def timed(fn: Callable[..., Any], /, *args: Any) -> Any:
        def run(*a: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*a)
            finally:
                cpu[getattr(fn, "__qualname__", "?")] += time.thread_time() - c0

        return await plain(run, *args)

    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith("gpubot") and getattr(m, "in_thread", 0) is plain:
            setattr(m, "in_thread", timed)  # noqa: B010


async def arm(name: str, nodes: int, sweeps: int) -> dict[str, Any]:
    """Run the bot's first ``sweeps`` sweeps of ``nodes`` recorded nodes here, arm ``name``."""
    from gpubot.lifecycle import SweepHeap, settle_heap

    if name != "now":
        no_hand_over()
    if name == "old":
        old_store()
    with tempfile.TemporaryDirectory(prefix="gpubot-first-sweep-") as tmp:
        app, _ = recorded_app(Path(tmp), nodes)
        cpu: collections.defaultdict[str, float] = collections.defaultdict(float)
        timed_store(cpu)
        settle_heap()
        heap = SweepHeap()
        app.sweep.heap = heap.around
        watch, rows = Watch(), []
        try:
            for _ in range(sweeps):
                cpu.clear()
                with watch.running():
                    t0 = time.perf_counter()
                    res = await app.sweep.run(alerting=True)
                    wall = time.perf_counter() - t0
                    await asyncio.sleep(0.2)
                assert len(res.snapshots) == nodes, res.failed
                late, own, _ = watch.worst()
                rows.append({"wall": wall, "late": late, "own": own} | {c: cpu[c] for c in CALLS})
        finally:
            await app.close()
    return {"arm": name, "sweeps": rows}


def run(nodes: int, sweeps: int, rounds: int) -> dict[str, Any]:
    """Alternate the arms' processes ``rounds`` times; return every sweep's figures."""
    argv = [*ARGV, "--nodes", str(nodes), "--sweeps", str(sweeps)]
    res = alternate(argv, ARMS, rounds, lambda line: line["sweeps"])
    return {"nodes": nodes, "sweeps": sweeps, "rounds": rounds, **res}


def report(res: dict[str, Any]) -> list[str]:
    """Return the Markdown of one run: every sweep of every arm."""
    rows = []
    for a in ARMS:
        for r, sweeps in enumerate(res[a], 1):
            for i, s in enumerate(sweeps, 1):
                figures = [ms(s[k]) for k in ("late", "own", *CALLS)]
                rows.append([a, f"{r}.{i}", f"{s['wall']:.2f}", *figures])
    header = ["arm", "round.sweep", "wall s", "worst late ms", "… less CPU wait ms"]
    header += [f"{c} CPU ms" for c in CALLS]
    return [
        f"The first {res['sweeps']} sweeps of a new bot over {res['nodes']} nodes, the arms "
        f"alternating ({res['rounds']} rounds; load " + "; ".join(res["load"]) + "):",
        "",
        table(header, rows),
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.first_sweep")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--sweeps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--arm", choices=ARMS, help="run one arm here (what the runner starts)")
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.sweeps, a.rounds = 20, 1, 1
    if a.arm is not None:
        print(json.dumps(asyncio.run(arm(a.arm, a.nodes, a.sweeps))))
        return 0
    res = run(a.nodes, a.sweeps, a.rounds)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1))
    print("\n".join(report(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
