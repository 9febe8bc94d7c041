"""``gpubot reset NODE ...`` and ``gpubot gpu-reset NODE --gpu N``."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Awaitable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpubot.app import App
from gpubot.cli.common import (
    agreed,
    cli_actor,
    color,
    interrupted_json,
    interrupted_on,
    linux_user,
    print_interrupted,
    with_app,
)
from gpubot.cli.output import kept_going
from gpubot.cli.render import render_plan_lines, render_reset
from gpubot.core import commands
from gpubot.core.commands import clean_reason
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import ResetInterrupted, UsageError
from gpubot.services.reset import Ask, ResetEvent, ResetResult

if TYPE_CHECKING:
    from gpubot.store import ActionSummary


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {v}")
    return v


def _grace(text: str) -> float:
    """``--grace``: the chat's grammar (``commands.parse_grace``), as an argparse error."""
    try:
        return commands.parse_grace(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_reset_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument(
        "--gpu", type=_nonneg_int, action="append", default=[], help="GPU index (repeat)"
    )
    p.add_argument("--pid", type=_nonneg_int, action="append", default=[], help="only this PID")
    p.add_argument("--user", help="only this Linux user's processes")
    p.add_argument("--grace", type=_grace, help="time between SIGTERM and SIGKILL (30s, 1m30s)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument("--force", action="store_true", help="allow killing other users' processes")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--because", metavar="TEXT", help="why: shown with the plan and kept in the audit log"
    )


def add_gpu_reset_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--gpu", type=_nonneg_int, required=True, help="GPU index")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("not a terminal: add --yes to go ahead without being asked")
    if not agreed(question):
        raise UsageError("cancelled; nothing was done")


def _ask(args: argparse.Namespace, grace_s: float | None = None) -> Ask:
    """Return the CLI's ask: the command as typed, its events on stderr unless ``--json``."""
    events = None if args.json else _print_event
    command = shlex.join(["gpubot", *args._argv])
    return Ask.by(cli_actor(), "cli", command, grace_s=grace_s, on_event=events)


async def _print_event(event: ResetEvent) -> None:
    if event.kind in {"signal", "exited", "verifying", "gpu_outcome", "gpu_reset"}:
        detail = " ".join(f"{k}={v}" for k, v in event.data.items() if k != "detail")
        print(f"  {event.kind}: {detail}", file=sys.stderr)


async def _finished(
    work: Awaitable[ResetResult], as_json: bool, found: list[ActionSummary] | None
) -> int:
    """Print the reset's outcome; one cut off after signals went out prints what was sent and
    exits 2 like any error."""
    try:
        result = await work
    except ResetInterrupted as exc:
        if not as_json:
            raise
        print(json.dumps({**exc.document, "interrupted": interrupted_json(found)}, indent=2))
        print(f"gpubot: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({**result.to_dict(), "interrupted": interrupted_json(found)}, indent=2))
    else:
        print(render_reset(result, color=color()))
    return 0 if result.ok else 1


async def _interrupted(app: App, node: str, as_json: bool) -> list[ActionSummary] | None:
    """Return (and, on a terminal, say first) what was interrupted on ``node`` before."""
    found = await interrupted_on(app.store, [node])
    if not as_json:
        print_interrupted(found, sys.stderr)
    return found


def run_reset(args: argparse.Namespace) -> int:
    """Plan, confirm and run a reset; exit 0 when every targeted GPU ends freed. Its output
    cannot stop it (``output.kept_going``)."""
    request = ResetRequest(
        node=args.node,
        requester=linux_user(),
        gpus=tuple(args.gpu),
        pids=tuple(args.pid),
        user=args.user,
        grace_s=args.grace,
    )

    async def body(app: App) -> int:
        found = await _interrupted(app, args.node, args.json)
        plan, before = await app.reset.plan(request)
        plan = replace(plan, reason=clean_reason(args.because))  # never changes the targets
        if args.dry_run:
            if args.json:
                doc: dict[str, Any] = {"node": plan.node, "plan": plan.to_dict()}
                doc |= {"steps": [], "gpus": [], "interrupted": interrupted_json(found)}
                print(json.dumps(doc, indent=2))
            else:
                print("\n".join(render_plan_lines(plan)))
            return 0
        if not args.json:
            print("\n".join(render_plan_lines(plan)), file=sys.stderr)
        if plan.forced and not args.force:
            raise UsageError(
                f"this reset kills processes of {', '.join(plan.owners)}: "
                "add --force to do it anyway (recorded as a forced kill)"
            )
        _confirm(f"signal {len(plan.targets)} process(es) on {plan.node}?", args.yes)
        work = app.reset.execute(plan, _ask(args, grace_s=args.grace), before=before)
        return await _finished(work, args.json, found)

    if args.dry_run:  # changes nothing: a closed pipe may end it (141) like any command
        return with_app(args, True, body)
    with kept_going():  # from here to its outcome, the reset's output cannot stop it
        return with_app(args, True, body)


def run_gpu_reset(args: argparse.Namespace) -> int:
    """Reset one orphaned GPU with nvidia-smi --gpu-reset and verify it."""

    async def body(app: App) -> int:
        found = await _interrupted(app, args.node, args.json)
        _confirm(f"run nvidia-smi --gpu-reset on {args.node} GPU {args.gpu}?", args.yes)
        work = app.reset.gpu_reset(args.node, args.gpu, _ask(args))
        return await _finished(work, args.json, found)

    with kept_going():  # as a reset's: its output cannot stop it between reset and verify
        return with_app(args, True, body)
