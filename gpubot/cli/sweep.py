"""``gpubot sweep [--json]``: look for zombie processes, orphaned VRAM and idle holders, now.

It stores this sweep's samples and records the query, but leaves the alert state to the
scheduled sweeps of ``gpubot serve``. Exit status: 0 nothing found, 1 findings or failing nodes.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpubot.app import App
from gpubot.cli.common import (
    cli_actor,
    interrupted_json,
    interrupted_on,
    print_interrupted,
    with_app,
)
from gpubot.core.alerting import SweepResult
from gpubot.core.text import one_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:

    async def body(app: App) -> int:
        result = await app.sweep.run(alerting=False, source="cli", actor=cli_actor())
        found = await interrupted_on(app.store, result.nodes)
        if args.json:
            print(
                json.dumps({**result.to_dict(), "interrupted": interrupted_json(found)}, indent=2)
            )
        else:
            print(render(result))
            print_interrupted(found, sys.stdout)
        return 0 if result.ok else 1

    return with_app(args, False, body)


def render(result: SweepResult) -> str:
    n, bad, found = len(result.nodes), len(result.failed), len(result.findings)
    out = [f"sweep: {n} node(s) in {result.seconds:.1f} s, {bad} failing, {found} finding(s)"]
    if result.vouched:
        out[0] += f", {len(result.vouched)} vouched for by Prometheus (not probed)"
    out += [f"note: {note}" for note in result.notes]
    if not result.findings:
        out.append("nothing found: no zombie processes, orphaned memory or failing nodes")
    width = max((len(f.node) for f in result.findings), default=0)
    for f in result.findings:
        gpu = "-" if f.gpu is None else f"GPU {f.gpu}"
        state = result.known.get(f.key)
        at = None if state is None else state.alerted_at
        seen = "" if at is None else f"  [alerted {at:%Y-%m-%d %H:%M} UTC]"
        out.append(f"{f.node:<{width}}  {gpu:<6} {f.kind.value:<16} {f.summary}{seen}")
        if f.source is not None:
            out.append(f"{'':<{width}}  ({f.source})")
        ready = result.readiness.get((f.node, f.gpu)) if f.gpu is not None else None
        if ready is not None:
            out.append(f"{'':<{width}}  before `gpubot gpu-reset {f.node} --gpu {f.gpu}`:")
            out.extend(f"{'':<{width}}    - {line}" for line in ready.lines())
    if result.idle_gpu_hours:
        held = ", ".join(f"{u} {h:.1f}" for u, h in result.idle_gpu_hours.items())
        out.append(f"GPU-hours held idle: {held}")
    return "\n".join(map(one_line, out))  # a name's newline or escape sequence stays \\xNN
