"""``gpubot status [NODE|GROUP ...] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys

from gpubot.app import App
from gpubot.cli.claim_lines import claim_text, claims_on
from gpubot.cli.common import (
    cli_actor,
    color,
    interrupted_json,
    interrupted_on,
    print_interrupted,
    with_status_app,
)
from gpubot.cli.render import fleet_dict, render_fleet


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the status arguments."""
    p.add_argument(
        "targets", nargs="*", metavar="NODE|GROUP", help="nodes or groups (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    """Print per-GPU tables; exit 0 when every node answered, 1 otherwise."""

    async def body(app: App) -> int:
        names = args.targets or ["all"]
        nodes = app.status.resolve(names)
        status = await app.status.fleet(names, actor=cli_actor(), source="cli")
        # The store is open (or known unusable) once the query is recorded, as fleet() does.
        found = await interrupted_on(app.store, [n.name for n in nodes])
        claimed = await claims_on(app, [n.name for n in nodes])  # [claims] enabled only
        if args.json:
            doc = fleet_dict(status, [n.name for n in nodes])
            doc["interrupted"] = interrupted_json(found)
            if claimed is not None:
                doc["claims"] = [{**c.to_dict(), "text": claim_text(c)} for c in claimed]
            print(json.dumps(doc, indent=2))
        else:
            print(render_fleet(status, color=color()))
            for c in claimed or ():
                print(f"{c.node} GPU {c.gpu}: {claim_text(c)}")
            print_interrupted(found, sys.stdout)
        return 0 if status.ok else 1

    return with_status_app(args, body)  # the store opens while the nodes are probed
