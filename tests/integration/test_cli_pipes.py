"""Every ``gpubot`` subcommand with a closed stdout (``gpubot … | head`` once ``head`` is done):
a quiet end with 141 (128 + SIGPIPE), never a ``BrokenPipeError`` traceback.

The subcommands come from the argparse parser itself, so a new one is run here without anyone
listing it; one that needs arguments fails ``test_every_subcommand_has_its_arguments`` until
``ARGS`` gives them. The control runs the same commands through ``run_command`` (``main``
without its handler) and sees the traceback this test exists to catch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from gpubot.cli import COMMANDS, EXIT_SIGPIPE, build_parser
from gpubot.store.version import HEAD
from gpusim.fleet import SimFleet

ENTRY = "import sys; from gpubot.cli import main; sys.exit(main())"
NO_HANDLER = "import sys; from gpubot.cli import run_command; sys.exit(run_command())"
# Named by issue 25: each ended in a BrokenPipeError traceback before main() handled it.
ISSUE_CASES = [("status", "--json"), ("sweep", "--json"), ("audit", "export")]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return cast(dict[str, argparse.ArgumentParser], action.choices)
    return {}


def leaves() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every runnable command path (``("audit", "export")``) with its parser."""
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        subs = subparsers(parser)
        if not subs:
            out[path] = parser
        for name, sub in subs.items():
            walk((*path, name), sub)

    for name in COMMANDS:
        walk((name,), subparsers(build_parser(name))[name])
    return out


LEAVES = leaves()


@dataclass(frozen=True)
class Env:
    config: Path
    sim_dir: Path  # the fixture fleet's control socket (sim spawn|fault|state)
    tmp: Path
    action: str  # the id of a reset in the audit log (audit show|review)


# What each command that needs arguments gets; {sim}, {tmp}, {action} are filled in from Env.
# Harmless on the simulated fleet: a dry-run reset, a downgrade to the revision it is at.
ARGS: dict[tuple[str, ...], list[str]] = {
    ("reset",): ["node1", "--dry-run"],
    ("gpu-reset",): ["node1", "--gpu", "0", "--yes"],
    ("diag",): ["node1", "--gpu", "0"],  # no dcgmi on the fleet: one line, exit 2
    ("audit", "show"): ["{action}"],
    ("audit", "review"): ["{action}", "--note", "pipes"],
    ("db", "downgrade"): [HEAD],
    ("sim", "up"): ["--dir", "{tmp}/up", "--nodes", "1", "--gpus", "1"],
    ("sim", "down"): ["--dir", "{tmp}/down"],
    ("sim", "spawn"): ["--dir", "{sim}", "--node", "node1", "--gpu", "0", "--mib", "16"],
    ("sim", "fault"): ["--dir", "{sim}", "--node", "node1", "none"],
    ("sim", "state"): ["--dir", "{sim}"],
    ("sim", "xid"): ["--dir", "{sim}", "--node", "node1", "--gpu", "0", "13"],
    ("claim",): ["claims", "all"],
}
# A reset that acts goes on to its outcome whatever happens to its output (issue 33,
# ``test_reset_output.py``): its exit status is the outcome's and its progress reaches stderr.
RUNS_TO_ITS_OUTCOME = {("gpu-reset",)}
STDIN: dict[tuple[str, ...], str] = {
    ("console",): "status node1\nhelp\nquit\n"
}  # the console reads its commands


def cases() -> Iterator[tuple[str, ...]]:
    for path, parser in LEAVES.items():
        yield path
        if any("--json" in a.option_strings for a in parser._actions):
            yield (*path, "--json")


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOT_", "SLACK_"))}


def run(
    env: Env | Path, code: str, *args: str, closed: bool = True, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run ``gpubot --config … ARGS`` with stdout a pipe whose reader is already gone."""
    config, cwd = (env, env.parent) if isinstance(env, Path) else (env.config, env.tmp)
    if not closed:  # an ordinary reader: what it printed is in stdout
        return subprocess.run(
            [sys.executable, "-c", code, "--config", str(config), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=environ(),
            cwd=cwd,
            timeout=120,
        )
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [sys.executable, "-c", code, "--config", str(config), *args],
            input=stdin,
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            env=environ(),
            cwd=cwd,
            timeout=120,
        )
    finally:
        os.close(w)


def argv_of(env: Env, case: tuple[str, ...]) -> list[str]:
    path = tuple(a for a in case if a != "--json")
    extra = [a.format(sim=env.sim_dir, tmp=env.tmp, action=env.action) for a in ARGS.get(path, [])]
    return [*path, *extra, *case[len(path) :]]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("pipes")
    with SimFleet(tmp / "fleet", nodes=2, gpus=2, release_delay_s=0.1) as sim:
        assert run(sim.config_path, ENTRY, "db", "upgrade", closed=False).returncode == 0
        job = sim.node("node2").spawn(gpu=1, mib=64)
        p = run(
            sim.config_path,
            ENTRY,
            "reset",
            "node2",
            "--pid",
            str(job.pid),
            "--yes",
            "--json",
            closed=False,
        )
        assert p.returncode == 0, p.stderr
        listed = run(sim.config_path, ENTRY, "audit", "list", "--json", closed=False)
        (action,) = json.loads(listed.stdout)
        yield (e := Env(sim.config_path, sim.directory, tmp, str(action["id"])))
        for d in ("up", "down"):  # the daemons `sim up` started, should a case have failed
            if (tmp / d).exists():
                run(e, ENTRY, "sim", "down", "--dir", str(tmp / d), closed=False)


def before(env: Env, case: tuple[str, ...]) -> Callable[[], None]:
    """Set up what ``case`` acts on; return what undoes it (and checks it was done)."""
    if case[:2] == ("sim", "down"):  # a daemon to stop
        where = str(env.tmp / "down")
        up = run(env, ENTRY, "sim", "up", "--dir", where, "--nodes", "1", closed=False)
        assert up.returncode == 0, up.stderr
    if case[:2] in (("sim", "up"), ("sim", "down")):
        d = env.tmp / case[1]

        def stop() -> None:
            if d.exists():
                run(env, ENTRY, "sim", "down", "--dir", str(d), closed=False)

        return stop
    return lambda: None


def test_every_subcommand_has_its_arguments() -> None:
    """A command with required arguments runs here only once ARGS gives them."""
    missing = [
        " ".join(path)
        for path, parser in LEAVES.items()
        if path not in ARGS
        and any(a.required and a.nargs not in ("?", "*") for a in parser._actions)
    ]
    assert missing == [], f"add these commands' arguments to ARGS: {missing}"
    assert [p for p in ARGS if p not in LEAVES] == []  # no stale entry
    assert len(LEAVES) >= 15 and ("audit", "export") in LEAVES  # the walk found the tree


@pytest.mark.parametrize("case", list(cases()), ids=" ".join)
def test_a_closed_stdout_ends_quietly(env: Env, case: tuple[str, ...]) -> None:
    undo = before(env, case)
    try:
        p = run(env, ENTRY, *argv_of(env, case), stdin=STDIN.get(case, ""))
    finally:
        undo()
    for sign in ("Traceback", "BrokenPipeError", "Exception ignored", "Broken pipe"):
        assert sign not in p.stderr, p.stderr
    if tuple(a for a in case if a != "--json") in RUNS_TO_ITS_OUTCOME:
        assert p.returncode == 0, p.stderr  # freed: its output dropped, not the reset
    elif p.returncode != EXIT_SIGPIPE:  # it wrote nothing to stdout: then it said why, if at all
        assert len(p.stderr.splitlines()) <= 1, p.stderr


@pytest.mark.parametrize("case", ISSUE_CASES, ids=" ".join)
def test_the_issue_cases_end_with_141(env: Env, case: tuple[str, ...]) -> None:
    p = run(env, ENTRY, *argv_of(env, case))
    assert (p.returncode, p.stderr) == (EXIT_SIGPIPE, "")


@pytest.mark.parametrize("case", ISSUE_CASES, ids=" ".join)
def test_control_without_the_handler_the_traceback_shows(env: Env, case: tuple[str, ...]) -> None:
    p = run(env, NO_HANDLER, *argv_of(env, case))
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "BrokenPipeError" in p.stderr, p.stderr


def test_control_an_open_pipe_gets_the_output_and_exit_zero(env: Env) -> None:
    """The same command with a reader: a real answer, so 141 above is the pipe, not the run."""
    p = run(env, ENTRY, "status", "--json", closed=False)
    assert (p.returncode, p.stderr) == (0, "")
