"""``gpubot status [NODE|GROUP ...] [--summary | --tables] [--watch [SECONDS]] [--json]``.

Above ``[cli] summary_above`` nodes the answer is one line per node. ``--watch`` redraws it over
one built app, so the first frame's SSH connections serve the next: on a terminal each frame is
drawn over the last, line by line, so no blank screen flickers; off one, frames follow each other
after an empty line. SIGTERM ends it with 0, as it ends ``gpubot serve``; Ctrl-C with 130. The
module stays light (no claims service): it is the cold path.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

from gpubot.app import App
from gpubot.cli.common import (
    cli_actor,
    color,
    duration_arg,
    interrupted_json,
    interrupted_on,
    print_interrupted,
    with_app,
)
from gpubot.cli.render import fleet_dict, render_fleet, render_summary
from gpubot.core.claims.rules import Claim
from gpubot.core.timefmt import iso
from gpubot.errors import StoreError

HOME, CLEAR_LINE, CLEAR_BELOW, CLEAR_ALL = "\033[H", "\033[K", "\033[J", "\033[2J"
DEFAULT_EVERY_S = 5.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT


def _every(text: str) -> float:
    value = duration_arg(text)
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected from 0.1s to 1d, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
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
        summary = args.summary or (not args.tables and len(order) > app.settings.cli.summary_above)
        # A summary reads the nodes whose telemetry is "prometheus" from there (SSH otherwise).
        read = app.status.summary if summary else app.status.fleet
        status = await read(names, actor=cli_actor(), source="cli")
        # The store is open (or known unusable) once the query is recorded, as fleet() does.
        found = await interrupted_on(app.store, order)
        claimed = await claims_on(app, order)  # [claims] enabled only
        if args.json:
            doc = fleet_dict(status, order)
            doc["interrupted"] = interrupted_json(found)
            if claimed is not None:
                doc["claims"] = [{**c.to_dict(), "text": claim_text(c)} for c in claimed]
            return json.dumps(doc, indent=None if args.watch else 2), status.ok
        out = io.StringIO()
        if summary:
            out.write(render_summary(status, order, color=color()) + "\n")
        else:
            # The terminal's width is read each frame: it may be resized.
            width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
            out.write(render_fleet(status, color=color(), width=width) + "\n")
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
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            return f"Every {args.watch:g} s: gpubot status · {at} · Ctrl-C ends\n\n{text}"

        tty = sys.stdout.isatty() and not args.json
        return await watch(one, args.watch, sys.stdout, tty=tty, gap="" if args.json else "\n")

    return with_app(args, False, watching if args.watch else once, cold=True)


async def claims_on(app: App, nodes: list[str]) -> list[Claim] | None:
    """Return the active claims of ``nodes`` (None: off or unavailable; the status stands)."""
    if not app.settings.claims.enabled or app.store is None:
        return None
    try:
        return [c for c in await app.store.claims.active() if c.node in nodes]
    except StoreError:
        return None


def claim_text(c: Claim) -> str:
    """Return "claimed by alice until 14:00Z · note" (UTC)."""
    note = f" · {c.note}" if c.note else ""
    return f"claimed by {c.user} until {iso(c.end)[11:16]}Z{note}"


def draw(out: TextIO, text: str, *, tty: bool, first: bool, gap: str) -> None:
    """Write one frame: over the last on a terminal, else after ``gap`` (an empty line)."""
    if tty:
        body = "\n".join(line + CLEAR_LINE for line in text.split("\n"))
        out.write((CLEAR_ALL if first else "") + HOME + body + "\n" + CLEAR_BELOW)
    else:
        out.write(("" if first else gap) + text + "\n")
    out.flush()  # a closed pipe shows here, as BrokenPipeError: main ends with 141


async def watch(
    frame: Callable[[], Awaitable[str]], every_s: float, out: TextIO, *, tty: bool, gap: str
) -> int:
    """Draw ``frame()`` every ``every_s`` seconds until SIGTERM (0) or SIGINT (130)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    code = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal code
        code = EXIT_INTERRUPTED if sig is signal.SIGINT else 0
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        first = True
        while not stop.is_set():
            started = loop.time()
            task = asyncio.ensure_future(frame())
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                break
            draw(out, task.result(), tty=tty, first=first, gap=gap)
            first = False
            left = every_s - (loop.time() - started)
            if left > 0:
                await asyncio.wait({stopping}, timeout=left)
    finally:
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return code
