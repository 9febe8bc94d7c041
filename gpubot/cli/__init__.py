"""The ``gpubot`` command: one subcommand per module, imported only when it is used."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence

# The chat front ends whose ids the settings may name, by import: an explicit list (the
# composition root names none; ``config.front_ends``).
import gpubot.matrix.ids
import gpubot.slack.ids  # noqa: F401
from gpubot import __version__
from gpubot.cli import logs
from gpubot.errors import GpubotError, StdoutClosed

# The commands that open one connection per node: they raise the soft descriptor limit first.
FLEET_COMMANDS = frozenset({"serve", "sweep", "status", "console"})
EXIT_SIGPIPE = 128 + 13  # 141: a closed pipe stopped the command (see main)
# 2: gpubot refused (a GpubotError), as argparse does for bad flags. A restart does not fix it,
# so the systemd unit's RestartPreventExitStatus= names it (a database down at boot fails
# ExecStartPre, which that does not cover, so that one is still retried).
EXIT_ERROR = 2


# name -> (module, one-line help). A module has ``add_arguments(parser)`` and ``run(args) -> int``
# (or ``add_<name>_arguments`` / ``run_<name>`` when one module serves several commands).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gpubot.cli.demo", "walk through gpubot on a simulated fleet (no GPU, Slack or DB)"),
    "status": ("gpubot.cli.status", "show per-GPU memory tables for nodes or groups"),
    "reset": ("gpubot.cli.reset", "free GPUs safely: plan, TERM, KILL, verify"),
    "gpu-reset": ("gpubot.cli.reset", "nvidia-smi --gpu-reset an orphaned GPU"),
    "diag": ("gpubot.cli.diag", "run DCGM's diagnostic (dcgmi diag) on one GPU, audited"),
    "sweep": ("gpubot.cli.sweep", "look for zombie processes and orphaned VRAM now"),
    "report": ("gpubot.cli.report", "GPU-hours held busy, idle and claimed but unused"),
    "audit": ("gpubot.cli.audit", "list, show, review, export and verify the audit log"),
    "doctor": ("gpubot.cli.doctor", "check settings, nodes, Slack and the database; say each fix"),
    "db": ("gpubot.cli.db", "database migrations"),
    "serve": ("gpubot.cli.serve", "run the Slack bot (or the Matrix bot: --chat matrix)"),
    "console": ("gpubot.cli.console", "type /gpu commands on a terminal"),
    "claim": ("gpubot.cli.claims", "claim GPUs, extend, release, list claims, queue (--json)"),
    "maint": ("gpubot.cli.maint", "plan, end or list maintenance windows, audited"),
    "sim": ("gpubot.cli.demo", "run and drive a simulated GPU fleet"),  # the demo's simulator
}


VALUED_OPTIONS = ("--config", "--log-level", "--log-format")  # the global options taking a value


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """Build the parser; only ``command``'s module is imported."""
    parser = argparse.ArgumentParser(prog="gpubot", description="Chat-ops for shared GPU boxes.")
    parser.add_argument("--version", action="version", version=f"gpubot {__version__}")
    parser.add_argument(
        "--config", metavar="PATH", help="settings file (default: $GPUBOT_CONFIG or ./gpubot.toml)"
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=logs.LEVELS,
        help=f"log from this level on (default: ${logs.LEVEL_ENV} or {logs.DEFAULT_LEVEL})",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=logs.FORMATS,
        help="text (ISO 8601 UTC times) or json (one object a line) "
        f"(default: ${logs.FORMAT_ENV} or {logs.DEFAULT_FORMAT})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            mod = importlib.import_module(module)
            adder = getattr(mod, f"add_{name.replace('-', '_')}_arguments", None)
            (adder or mod.add_arguments)(p)
            p.set_defaults(_module=module, _name=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run gpubot; return the exit status. A reader that goes away ends the command quietly
    with 141 (128 + SIGPIPE), as a shell reports it, so ``set -o pipefail`` scripts can tell it
    from gpubot's own failures."""
    try:
        try:
            return run_command(argv)
        finally:  # also after --help: what is still buffered goes while a closed pipe is caught
            sys.stdout.flush()
    except (BrokenPipeError, StdoutClosed):
        if not _stdout_closed():
            raise  # some other pipe or socket: not the reader of our output going away
        from gpubot.cli.output import to_devnull

        to_devnull(sys.stdout)  # Python flushes stdout again at exit: that cannot fail now
        return EXIT_SIGPIPE


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, configure logging and run the command (``main`` without its closed-pipe
    handling)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(args_in)
    try:
        parser = build_parser(command)
        args = parser.parse_args(args_in)
        args._argv = tuple(args_in)  # the command as typed (the audit log records it)
        logs.configure(args.log_level, args.log_format, os.environ)
        if command in FLEET_COMMANDS:  # one connection per node: as servers do
            from gpubot.transport.descriptors import raise_soft_limit

            raise_soft_limit()
        mod = importlib.import_module(args._module)
        runner = getattr(mod, f"run_{args._name.replace('-', '_')}", None) or mod.run
        return int(runner(args))
    except GpubotError as exc:
        print(f"gpubot: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("gpubot: interrupted", file=sys.stderr)
        return 130


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll says POLLERR/POLLHUP)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _command_of(args: list[str]) -> str | None:
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in VALUED_OPTIONS:
            skip = True
        elif not a.startswith("-"):
            return a
    return None
