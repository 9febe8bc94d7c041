"""``gpubot report [--since 7d] [--until WHEN] [--by user|team|node] [--json|--csv]``: GPU-hours.

Summed from the buckets every sweep adds, over whole UTC hours; the report says how many sweeps
it covers and where data is missing. Exit status: 0, or 2 for a bad window.
"""

from __future__ import annotations

import argparse
import json

from gpubot.app import App
from gpubot.cli.common import with_app
from gpubot.core.usage.report import BY, DEFAULT_SINCE
from gpubot.errors import StoreError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="WHEN",
        help="a duration ago (7d, 12h) or a UTC date/time (2026-11-25, 2026-11-25T09:00); "
        f"default {DEFAULT_SINCE}",
    )
    p.add_argument("--until", default=None, metavar="WHEN", help="the same forms; default now")
    p.add_argument("--by", default="user", type=str.lower, choices=BY, help="rows (default user)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--csv", action="store_true", help="print CSV (hours, three decimals)")


def run(args: argparse.Namespace) -> int:

    async def body(app: App) -> int:
        if app.chat.usage is None:
            raise StoreError("GPU-hours need the database, which could not be opened")
        report = await app.chat.usage.report(args.since, args.until, by=args.by)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        elif args.csv:
            print(report.csv(), end="")
        else:
            print(report.text())
        return 0

    return with_app(args, True, body)
