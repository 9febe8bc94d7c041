"""The ``gpubot`` command: one subcommand per module, imported only when it is used."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from gpubot import __version__
from gpubot.descriptors import FLEET_COMMANDS, raise_soft_limit
from gpubot.errors import GpubotError

# name -> (module, one-line help). A module has ``add_arguments(parser)`` and ``run(args) -> int``
# (or ``add_<name>_arguments`` / ``run_<name>`` when one module serves several commands).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gpubot.cli.demo", "walk through gpubot on a simulated fleet (no GPU, Slack or DB)"),
    "status": ("gpubot.cli.status", "show per-GPU memory tables for nodes or groups"),
    "reset": ("gpubot.cli.reset", "free GPUs safely: plan, TERM, KILL, verify"),
    "gpu-reset": ("gpubot.cli.reset", "nvidia-smi --gpu-reset an orphaned GPU"),
    "sweep": ("gpubot.cli.sweep", "look for zombie processes and orphaned VRAM now"),
    "audit": ("gpubot.cli.audit", "list, show, review, export and verify the audit log"),
    "db": ("gpubot.cli.db", "database migrations"),
    "serve": ("gpubot.cli.serve", "run the Slack bot"),
    "console": ("gpubot.cli.console", "type /gpu commands on a terminal"),
    "sim": ("gpubot.cli.demo", "run and drive a simulated GPU fleet"),  # the demo's simulator
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """Build the parser; only ``command``'s module is imported."""
    parser = argparse.ArgumentParser(prog="gpubot", description="Chat-ops for shared GPU boxes.")
    parser.add_argument("--version", action="version", version=f"gpubot {__version__}")
    parser.add_argument(
        "--config", metavar="PATH", help="settings file (default: $GPUBOT_CONFIG or ./gpubot.toml)"
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
    """Run gpubot; return the exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(args_in)
    logging.basicConfig(level=logging.WARNING, format="gpubot: %(levelname)s: %(message)s")
    if command in FLEET_COMMANDS:
        raise_soft_limit()  # one connection per node: as servers do (issue 24)
    try:
        parser = build_parser(command)
        args = parser.parse_args(args_in)
        args._argv = tuple(args_in)  # the command as typed (the audit log records it)
        mod = importlib.import_module(args._module)
        runner = getattr(mod, f"run_{args._name.replace('-', '_')}", None) or mod.run
        return int(runner(args))
    except GpubotError as exc:
        print(f"gpubot: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpubot: interrupted", file=sys.stderr)
        return 130


def _command_of(args: list[str]) -> str | None:
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--config":
            skip = True
        elif not a.startswith("-"):
            return a
    return None
