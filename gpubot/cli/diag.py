"""``gpubot diag NODE --gpu N [--level quick|medium] [--json]``: DCGM's diagnostic on one GPU.

The same run as chat's ``/gpu diag`` (``DiagService``: ``dcgmi diag -r 1|2 -i N -j`` within
``[reset] diag_quick_s`` / ``diag_medium_s``, audited as kind ``diag``), asked by the CLI's user.
It prints the verdict, one row per test and the audit record (``--json``: one document). Exit
status: 0 when the GPU passed (warnings included), 1 when it failed or no test judged it, 2 when
no diagnostic ran (DCGM missing, stopped at its limit, an answer that cannot be read: one line).
"""

from __future__ import annotations

import argparse
import json
import shlex

from gpubot.app import App
from gpubot.cli.common import cli_actor, with_app
from gpubot.core.health.diag import LEVELS
from gpubot.services.reset import Ask

VERDICT = {
    "pass": "passed",
    "warn": "passed with warnings",
    "fail": "FAILED",
    "none": "no test judged the GPU",
}


def _gpu(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU index: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a GPU index is 0 or more, not {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--gpu", type=_gpu, required=True, help="GPU index")
    p.add_argument(
        "--level", choices=sorted(LEVELS), default="quick", help="quick (-r 1) or medium (-r 2)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    """Run the diagnostic, print its table (or document) and exit by its verdict."""
    from gpubot.chat.diag_view import diag_text  # the table chat's console prints

    async def body(app: App) -> int:
        service = app.diag()  # built with a store: every run is audited
        ask = Ask.by(cli_actor(), "cli", shlex.join(["gpubot", *args._argv]))
        done = await service.run(ask, args.node, args.gpu, args.level)
        if args.json:
            print(json.dumps({**done.to_dict(), "audit_id": done.action_id}, indent=2))
        else:
            verdict = VERDICT.get(done.verdict, done.verdict)
            print(f"dcgmi diag {done.node} GPU {done.gpu} ({done.level}): {verdict}")
            if done.rows:
                print("\n".join(diag_text(done)))
            if done.report.runtime_error is not None:
                print(f"DCGM could not run: {done.report.runtime_error}")
            version = (
                f"DCGM {done.report.version}" if done.report.version else "DCGM version not said"
            )
            print(f"{version} · audit #{done.action_id}")
        return 0 if done.verdict in ("pass", "warn") else 1

    return with_app(args, True, body)
