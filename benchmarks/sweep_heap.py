"""Loop stalls during sweeps of 2,000 nodes: the collector left alone beside ``SweepHeap``.

::

    python -m benchmarks.sweep_heap                  # 2,000 nodes, 3 rounds of 4 sweeps
    python -m benchmarks.sweep_heap --smoke          # tiny: keeps it working
    python -m benchmarks.sweep_heap --arms count,heap --rounds 2 --sweeps 3  # the valve's walk

The bot as ``serve`` runs it (``gpubot.app.build`` over SQLite, the start-up heap frozen with
``lifecycle.settle_heap``) with ``benchmarks.scale_store``'s recorded transport: every node
answers with one real probe answer after a 1-51 ms delay, so only the bot's side runs. Each
arm is a process of its own (the collector is process-wide: one arm's freezes would help the
other), and the arms alternate, ``base`` then ``heap``, round after round, so that the box's
load falls on both alike. ``base``: the sweep as before. ``heap``: ``SweepHeap`` around each
sweep (no full collection while it runs, its survivors frozen after). ``count`` (``--arms
count,heap``): ``heap`` with the settle as it was before ``benchmarks/stall_locate.py`` found its
valve's walk of the frozen objects (``old_settle``). Per sweep: the worst wake-
up lateness of a 5 ms loop timer (wall, and less the time the loop's thread waited for a CPU),
the loop thread's worst CPU in one tick, the longest collection and the full collections seen.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import table
from benchmarks.scale_store import Watch, alternate, ms, recorded_app

ARMS = ("base", "heap", "count")  # count: SweepHeap as before it stopped counting frozen objects
ARGV = (sys.executable, "-m", "benchmarks.sweep_heap")


def old_settle(self: Any) -> None:
    """``SweepHeap.settle`` before the stall locator: its valve counted the frozen objects
    (``gc.get_freeze_count``, a walk of them all, on the loop). Kept for the ``count`` arm."""
    t0 = time.perf_counter()
    gc.collect(1)
    gc.freeze()
    count = gc.get_freeze_count()
    self.settle_s = time.perf_counter() - t0
    if self.baseline is None:
        self.baseline = count
        return
    if count <= self.baseline * self.slack + self.floor:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    self.full_passes += 1
    self.baseline = gc.get_freeze_count()


class FullPasses:
    """Counts the collector's full passes (generation 2) while installed."""

    def __init__(self) -> None:
        self.count = 0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info.get("generation") == 2:
            self.count += 1


async def arm(name: str, nodes: int, sweeps: int) -> dict[str, Any]:
    """Run ``sweeps`` sweeps of ``nodes`` recorded nodes in this process, arm ``name``."""
    from gpubot.lifecycle import SweepHeap, settle_heap

    with tempfile.TemporaryDirectory(prefix="gpubot-sweep-heap-") as tmp:
        work = Path(tmp)
        app, _ = recorded_app(work, nodes)
        settle_heap()  # as App.running does for serve
        heap = None if name == "base" else SweepHeap()
        if name == "count":
            heap.settle = old_settle.__get__(heap)  # type: ignore[method-assign,union-attr]
        if heap is not None:
            app.sweep.heap = heap.around
        watch, full = Watch(), FullPasses()
        rows = []
        try:
            for _ in range(sweeps):
                full.count = 0
                with watch.running():
                    t0 = time.perf_counter()
                    res = await app.sweep.run(alerting=True)
                    wall = time.perf_counter() - t0
                    await asyncio.sleep(0.2)  # what the sweep leaves behind runs here too
                assert len(res.snapshots) == nodes, res.failed
                late, own, cpu = watch.worst()
                rows.append(
                    {
                        "wall": wall,
                        "late": late,
                        "own": own,
                        "cpu": cpu,
                        "gc": watch.gc_worst,
                        "full": full.count,
                        "frozen": gc.get_freeze_count(),
                        "settle": 0.0 if heap is None else heap.settle_s,
                    }
                )
        finally:
            await app.close()
    return {"arm": name, "sweeps": rows}


def run(
    nodes: int, sweeps: int, rounds: int, arms: tuple[str, ...] = ("base", "heap")
) -> dict[str, Any]:
    """Alternate the arms' processes ``rounds`` times; return every sweep's figures."""
    argv = [*ARGV, "--nodes", str(nodes), "--sweeps", str(sweeps)]
    res = alternate(argv, arms, rounds, lambda line: line["sweeps"])
    return {"nodes": nodes, "sweeps": sweeps, "rounds": rounds, "arms": list(arms), **res}


def report(res: dict[str, Any]) -> list[str]:
    """Return the Markdown of one run: every sweep, then the medians and the worst."""
    rows = []
    arms = res.get("arms", ["base", "heap"])
    for a in arms:
        for r, sweeps in enumerate(res[a], 1):
            for i, s in enumerate(sweeps, 1):
                figures = [ms(s[k]) for k in ("late", "own", "cpu", "gc")]
                settle = [str(s["full"]), ms(s["settle"]), f"{s['frozen']:,}"]
                rows.append([a, f"{r}.{i}", f"{s['wall']:.2f}", *figures, *settle])
    lines = [
        f"Loop stalls during sweeps of {res['nodes']} nodes, the arms alternating "
        f"({res['rounds']} rounds × {res['sweeps']} sweeps each; load "
        + "; ".join(res["load"])
        + "):",
        "",
        table(
            [
                "arm",
                "round.sweep",
                "wall s",
                "worst late ms",
                "… less CPU wait ms",
                "loop CPU in one tick ms",
                "longest GC ms",
                "full GCs",
                "settle ms",
                "frozen objects after",
            ],
            rows,
        ),
        "",
    ]
    for a in arms:
        every = [s for sweeps in res[a] for s in sweeps]
        lines.append(
            f"- {a}: worst late median {ms(statistics.median(s['late'] for s in every))} ms, "
            f"max {ms(max(s['late'] for s in every))} ms; less CPU wait median "
            f"{ms(statistics.median(s['own'] for s in every))} ms, max "
            f"{ms(max(s['own'] for s in every))} ms; full GCs "
            f"{sum(s['full'] for s in every)} in {len(every)} sweeps"
        )
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep_heap")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--sweeps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arm", choices=ARMS, help="run one arm here (what the runner starts)")
    p.add_argument("--arms", default="base,heap", help="which arms, in turn (base,heap,count)")
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.sweeps, a.rounds = 30, 2, 1
    if a.arm is not None:
        print(json.dumps(asyncio.run(arm(a.arm, a.nodes, a.sweeps))))
        return 0
    arms = tuple(x for x in a.arms.split(",") if x)
    if not set(arms) <= set(ARMS):
        p.error(f"--arms: one of {', '.join(ARMS)} each")
    res = run(a.nodes, a.sweeps, a.rounds, arms)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1))
    print("\n".join(report(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
