"""``gpubot console``: the ``/gpu …`` commands on a terminal, answered as text, on the app
built on the console front end (``console.front``), its duties run as for every front end.

Approvals are typed as an approver named with ``--as U…`` (in ``[approvals] approvers``).
Without ``--as`` the console user is the local Unix user (``console:NAME``), who owns their own
processes on the boxes, except root or a ``[reset] system_users`` account: self-service never
acts as one.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os

from gpubot.app import App, build, settings_from
from gpubot.config import front_ends
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import ConsoleParts, repl
from gpubot.console.terminal import Prompt, banner, session
from gpubot.core.policy import Person, Policy, resolve, system_user_refusal
from gpubot.errors import UsageError
from gpubot.services.alert_keeper import NoAlerts


def identity(policy: Policy, as_id: str | None, name: str | None = None) -> Person:
    """Return who types at the console: ``--as`` a user id of the primary front end (its
    ``[users]`` and approvers), else the local Unix user."""
    if as_id is not None:
        ids = front_ends.primary()
        if ids is None or not ids.user.fullmatch(as_id):
            raise UsageError(f"--as {as_id!r}: expected {ids.user_words if ids else 'a user id'}")
        found = resolve(policy, as_id, None, None)
        return Person(as_id, name or as_id, found.linux_user, found.refused)
    user = getpass.getuser()
    mine = None if system_user_refusal(policy, user) else user  # never root's self-service
    return Person(f"console:{user}", name or user, mine)


def console_parts(app: App) -> ConsoleParts:
    """Return the console's parts of ``app`` (built on ``ConsoleFront``): its flows, the alert
    keeper's snooze (or one that refuses, with no store), the lifecycle and the app's close."""
    return ConsoleParts(app.flows, (app.sweep.keeper or NoAlerts()).snooze, app.running, app.close)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--as", dest="as_id", metavar="USER_ID", help="act as this Slack user id (e.g. an approver)"
    )
    parser.add_argument("--name", help="display name (default: the user)")
    parser.add_argument(
        "-c",
        "--command",
        action="append",
        metavar="LINE",
        help="run LINE and exit (repeatable) instead of reading stdin",
    )


def run(args: argparse.Namespace) -> int:
    """Answer the ``-c`` lines, or read ``/gpu`` lines (a terminal's prompt: line editing,
    history, Ctrl-C drops the line) and print the answers until end of input or quit."""
    settings = settings_from(args.config, os.environ)
    app = build(settings, os.environ, need_store=False, front=ConsoleFront())
    who = identity(app.flows.svc.policy, args.as_id, args.name)
    if args.command:
        return asyncio.run(repl(console_parts(app), who, args.command))
    return session(console_parts(app), who, Prompt(banner(who)))
