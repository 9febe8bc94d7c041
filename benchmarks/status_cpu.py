"""gpubot's own CPU per node in a warm ``status all`` and a sweep, two source trees side by side.

::

    python -m benchmarks.status_cpu --base /tmp/base     # 1,000 nodes, this tree beside /tmp/base
    python -m benchmarks.status_cpu --profile            # this tree only, cProfile's top entries
    python -m benchmarks.status_cpu --smoke              # tiny: keeps it working

The bot as ``gpubot.app.build`` wires it (SQLite) with ``benchmarks.scale_store``'s recorded
transport answering at once: every node gives the same real probe answer (a ``gpusim`` node, 8
GPUs, 4 processes), so no SSH runs and what is measured is gpubot's own work beyond the SSH
client (the floor): parsing, snapshots, the ``--json`` document and the Slack answer of
``status all`` (as ``benchmarks/scale.py`` renders them), the audit record; for a sweep, the
findings, samples, idle runs and alert state too. CPU is the whole process's (every thread:
the parsing runs in a worker), median of ``--repeat`` warm runs after two. Each tree's arm is a
process of its own (``--tree``: its ``gpubot`` and ``benchmarks`` come first on the path), and
the arms alternate, so that the box's load falls on both alike. Give ``--base`` a checkout of
the commit before (``git archive REV | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def cpu() -> float:
    return time.process_time()


class Instant:
    """A transport answering every exec at once with the recorded answers."""

    def __init__(self, answers: Any) -> None:
        self.answers = answers

    async def run(self, node: Any, argv: Any, *, timeout: float | None = None) -> Any:
        return self.answers.to(argv, node.name)

    async def close(self) -> None:
        return None


async def arm(nodes: int, repeat: int, profile: bool) -> dict[str, Any]:
    """Measure this process's tree: warm status and sweep CPU per node (ms)."""
    from benchmarks.scale_store import recorded_app
    from gpubot.chat.fleet_view import render_fleet
    from gpubot.cli.render import fleet_dict
    from gpubot.slack.render import to_slack

    with tempfile.TemporaryDirectory(prefix="gpubot-status-cpu-") as tmp:
        work = Path(tmp)
        app, answers = recorded_app(work, nodes, Instant)
        names = [n.name for n in app.settings.nodes]

        async def status() -> None:
            res = await app.status.fleet(["all"], actor="bench", source="bench")
            assert len(res.snapshots) == nodes, res.failed
            json.dumps(fleet_dict(res, names))
            title = "GPU status · all"
            to_slack(
                render_fleet(list(res.snapshots), res.failed, seconds=res.seconds, title=title)
            )

        async def sweep() -> None:
            res = await app.sweep.run(alerting=True)
            assert len(res.snapshots) == nodes, res.failed

        out: dict[str, Any] = {"python": sys.version.split()[0], "tree": str(tree_of())}
        try:
            for name, call in (("status", status), ("sweep", sweep)):
                await call()
                await call()
                runs = []
                for _ in range(repeat):
                    c0 = cpu()
                    await call()
                    runs.append((cpu() - c0) / nodes * 1000)
                out[name] = statistics.median(runs)
                if profile:
                    out[f"{name}_profile"] = await profiled(call)
            if profile:
                out["parse_profile"] = parse_profile(app.settings.nodes[0], answers.probe, nodes)
        finally:
            await app.close()
    return out


def tree_of() -> Path:
    import gpubot

    return Path(gpubot.__file__).resolve().parents[1]


async def profiled(call: Any) -> str:
    """Return cProfile's top entries of one more ``call()`` (the loop's thread only, its CPU)."""
    prof = cProfile.Profile(time.thread_time)  # CPU, not wall: the box is shared
    prof.enable()
    await call()
    prof.disable()
    return top(prof)


def top(prof: cProfile.Profile, n: int = 15) -> str:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(n)
    body = text.getvalue()
    return body[body.index("ncalls") :].rstrip().replace(str(tree_of()) + "/", "")


def parse_profile(node: Any, answer: Any, nodes: int) -> str:
    """Return cProfile's top entries of ``nodes`` parses (the worker thread's share)."""
    from gpubot.core.probe.snapshot import parse_probe

    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    for _ in range(nodes):
        parse_probe(node, answer, 1.0)
    prof.disable()
    return top(prof)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.status_cpu")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--base", help="a checkout of the commit before, run beside this one")
    p.add_argument("--arm", action="store_true", help="measure this process's tree (internal)")
    p.add_argument("--profile", action="store_true", help="also print cProfile's top entries")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.repeat, a.rounds = 20, 1, 1
    if a.arm:
        print(json.dumps(asyncio.run(arm(a.nodes, a.repeat, a.profile))))
        return 0
    trees = {"this": REPO} | ({"base": Path(a.base).resolve()} if a.base else {})
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    loads = []
    for _ in range(a.rounds):
        for name, tree in trees.items():
            before = " ".join(f"{x:.2f}" for x in os.getloadavg())
            args = [sys.executable, str(Path(__file__).resolve()), "--arm", "--nodes"]
            args += [str(a.nodes), "--repeat", str(a.repeat)] + (["--profile"] if a.profile else [])
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tree)
            if done.returncode != 0:
                raise SystemExit(f"{name}: {done.stderr[-2000:]}")
            res[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            loads.append(f"{name}: {before}")
    print(report(a.nodes, res, loads))
    return 0


def report(nodes: int, res: dict[str, list[dict[str, Any]]], loads: list[str]) -> str:
    lines = [
        f"gpubot's own CPU per node at {nodes} nodes (recorded answers, no SSH; load at each "
        f"arm's start: {'; '.join(loads)}):",
        "",
        "| tree | warm `status all` ms/node (each round) | sweep ms/node (each round) |",
        "|---|---|---|",
    ]
    for name, runs in res.items():
        st = " / ".join(f"{r['status']:.3f}" for r in runs)
        sw = " / ".join(f"{r['sweep']:.3f}" for r in runs)
        lines.append(f"| {name} | {st} | {sw} |")
    if "base" in res:
        for k in ("status", "sweep"):
            this = statistics.median(r[k] for r in res["this"])
            base = statistics.median(r[k] for r in res["base"])
            lines.append(f"\n- {k}: {base:.3f} → {this:.3f} ms/node ({this / base:.2f}×)")
    for name, runs in res.items():
        for k in ("status_profile", "sweep_profile", "parse_profile"):
            if k in runs[-1]:
                lines += ["", f"{name}, {k}:", "", "```", runs[-1][k], "```"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
