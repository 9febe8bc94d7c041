"""What every CLI subcommand shares: settings, the app, the CLI actor's name, TTY colour."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from gpubot.app import App, build, settings_from
from gpubot.core import durations
from gpubot.core.reset.interrupted import interrupted_dict, interrupted_lines
from gpubot.core.text import one_line
from gpubot.errors import StoreError

if TYPE_CHECKING:
    from gpubot.store import ActionSummary, Store

T = TypeVar("T")


def linux_user() -> str | None:
    """Return the Linux user running the CLI (the requester of a reset)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def cli_actor() -> str:
    """Return the audit name of whoever runs the CLI: ``cli:<os user>``, else its uid."""
    return f"cli:{linux_user() or f'uid-{os.getuid()}'}"


def agreed(question: str) -> bool:
    """Ask ``question`` on the terminal: only y or yes agrees (Ctrl-D, or a terminal gone: no)."""
    try:
        return input(f"{question} [y/N] ").strip().lower() in {"y", "yes"}
    except (EOFError, OSError):
        return False


def duration_arg(text: str) -> float:
    """An argparse type: a duration of ``core.durations``, or a plain number of seconds."""
    try:
        return durations.parse(text, bare=True)
    except durations.DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def with_app(
    args: argparse.Namespace,
    need_store: bool,
    body: Callable[[App], Awaitable[T]],
    *,
    cold: bool = False,
) -> T:
    """Build the app from the CLI's settings, run ``body`` and close everything. ``cold``: what
    ``status`` needs alone, its audit store opening while it probes the nodes (``App.run``)."""
    settings = settings_from(args.config, os.environ)

    async def main() -> T:
        app = build(settings, os.environ, need_store=need_store, cold=cold)
        try:
            return await app.run(body)
        finally:
            await app.close()

    return asyncio.run(main())


async def interrupted_on(
    store: Store | None, nodes: Sequence[str] | None
) -> list[ActionSummary] | None:
    """Return the interrupted, unreviewed actions on ``nodes``; None when there is no audit
    log or it cannot be read (said on stderr)."""
    if store is None:
        return None
    try:
        return await store.interrupted(nodes)
    except StoreError as exc:
        print(f"gpubot: warning: cannot list interrupted actions: {exc}", file=sys.stderr)
        return None


def print_interrupted(found: Sequence[ActionSummary] | None, out: TextIO) -> None:
    for line in interrupted_lines(found or ()):
        print(one_line(line), file=out)


def interrupted_json(found: Sequence[ActionSummary] | None) -> list[dict[str, Any]] | None:
    """Return the ``interrupted`` field of a ``--json`` document (null: not known)."""
    return None if found is None else [interrupted_dict(a) for a in found]
