"""What every CLI subcommand shares: settings, the app, the CLI actor's name, TTY colour."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpubot.app import App, StatusApp, build, build_status, settings_from

T = TypeVar("T")


def cli_actor() -> str:
    """Return the audit name of whoever runs the CLI: ``cli:<os user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return f"cli:uid-{os.getuid()}"


def linux_user() -> str | None:
    """Return the Linux user running the CLI (the requester of a reset)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def color() -> bool:
    """Whether to colour output: only on a TTY, and never with NO_COLOR set."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def with_app(args: argparse.Namespace, need_store: bool, body: Callable[[App], Awaitable[T]]) -> T:
    """Build the app from the CLI's settings, run ``body`` and close everything."""
    settings = settings_from(args.config, os.environ)

    async def main() -> T:
        app = build(settings, os.environ, need_store=need_store)
        try:
            return await body(app)
        finally:
            await app.close()

    return asyncio.run(main())


def with_status_app(args: argparse.Namespace, body: Callable[[StatusApp], Awaitable[T]]) -> T:
    """Run ``body`` on what ``status`` needs; the audit store opens while it probes the nodes."""
    settings = settings_from(args.config, os.environ)

    async def main() -> T:
        app = build_status(settings, os.environ)
        try:
            return await app.run(body)
        finally:
            await app.close()

    return asyncio.run(main())
