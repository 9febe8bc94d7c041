"""``gpubot status [NODE|GROUP ...] [--summary | --tables] [--watch [SECONDS]] [--json]``.

Above ``[cli] summary_above`` nodes the answer is one line per node. ``--watch`` redraws it over
one built app, so the first frame's SSH connections serve the next.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time

from gpubot.app import App
from gpubot.cli.claim_lines import claim_text, claims_on
from gpubot.cli.common import (
    cli_actor,
    color,
    duration_arg,
    interrupted_json,
    interrupted_on,
    print_interrupted,
    with_status_app,
)
from gpubot.cli.render import fleet_dict, render_fleet, render_summary
from gpubot.cli.watch import DEFAULT_EVERY_S, heading, watch


def _every(text: str) -> float:
    value = duration_arg(text)
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected from 0.1s to 1d, got {text!r}")
    return value


def terminal_width() -> int | None:
    """Return stdout's terminal columns, read each frame (it may be resized); None: no terminal."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the status arguments."""
    p.add_argument(
        "targets", nargs="*", metavar="NODE|GROUP", help="nodes or groups (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    view = p.add_mutually_exclusive_group()
    view.add_argument(
        "--summary",
        action="store_true",
        help="one line per node (the default above [cli] summary_above nodes)",
    )
    view.add_argument("--tables", action="store_true", help="every node's per-GPU table")
    p.add_argument(
        "--watch",
        nargs="?",
        type=_every,
        const=DEFAULT_EVERY_S,
        metavar="SECONDS",
        help=f"redraw every SECONDS or duration (1m; default {DEFAULT_EVERY_S:g}s) until "
        "Ctrl-C; with --json, one document a line",
    )


def run(args: argparse.Namespace) -> int:
    """Print the fleet; exit 0 when every node answered, 1 otherwise."""

    async def frame(app: App) -> tuple[str, bool]:
        names = args.targets or ["all"]
        order = [n.name for n in app.status.resolve(names)]
        status = await app.status.fleet(names, actor=cli_actor(), source="cli")
        # The store is open (or known unusable) once the query is recorded, as fleet() does.
        found = await interrupted_on(app.store, order)
        claimed = await claims_on(app, order)  # [claims] enabled only
        if args.json:
            doc = fleet_dict(status, order)
            doc["interrupted"] = interrupted_json(found)
            if claimed is not None:
                doc["claims"] = [{**c.to_dict(), "text": claim_text(c)} for c in claimed]
            return json.dumps(doc, indent=None if args.watch else 2), status.ok
        summary = args.summary or (not args.tables and len(order) > app.settings.cli.summary_above)
        out = io.StringIO()
        if summary:
            out.write(render_summary(status, order, color=color()) + "\n")
        else:
            out.write(render_fleet(status, color=color(), width=terminal_width()) + "\n")
        for c in claimed or ():
            out.write(f"{c.node} GPU {c.gpu}: {claim_text(c)}\n")
        print_interrupted(found, out)
        return out.getvalue().rstrip("\n"), status.ok

    async def once(app: App) -> int:
        text, ok = await frame(app)
        print(text)
        return 0 if ok else 1

    async def watching(app: App) -> int:
        async def one() -> str:
            text, _ = await frame(app)
            if args.json:
                return text
            return heading("gpubot status", args.watch, time.time()) + "\n\n" + text

        tty = sys.stdout.isatty() and not args.json
        return await watch(one, args.watch, sys.stdout, tty=tty, gap="" if args.json else "\n")

    return with_status_app(args, watching if args.watch else once)
