"""``gpubot status [NODE|GROUP ...] [--json]``."""

from __future__ import annotations

import argparse
import json

from gpubot.app import StatusApp
from gpubot.cli.common import cli_actor, color, with_status_app
from gpubot.cli.render import fleet_dict, render_fleet


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the status arguments."""
    p.add_argument(
        "targets", nargs="*", metavar="NODE|GROUP", help="nodes or groups (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    """Print per-GPU tables; exit 0 when every node answered, 1 otherwise."""

    async def body(app: StatusApp) -> int:
        names = args.targets or ["all"]
        nodes = app.status.resolve(names)
        status = await app.status.fleet(names, actor=cli_actor(), source="cli")
        if args.json:
            print(json.dumps(fleet_dict(status, [n.name for n in nodes]), indent=2))
        else:
            print(render_fleet(status, color=color()))
        return 0 if status.ok else 1

    return with_status_app(args, body)  # the store opens while the nodes are probed
