"""The login user of the benchmark fleets: ``gpubot-bench``, shell ``/bin/sh``, no home.

sshd runs every remote command through the login user's shell. root's shell here is bash, and
bash started by sshd sources ``~/.bashrc`` even when not interactive; this machine's runs
``pyenv init`` (several processes, and a lock that concurrent sessions queue on), which made
every remote command cost ~90 ms of CPU before it started and serialised parallel sessions.
That is this box's quirk, not SSH's nor any method's, so (as root) the fleets log in as a user
whose shell is dash and who has no rc files (password ``*``: no password, yet not a locked
account, which sshd would refuse). Without root the current user is used as it is.

Benchmark runs may overlap (the smoke test in CI, a manual run): a registry under a file lock
counts the live runs; the last one out removes the user if a run created it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpusim import simstate
from gpusim.fleet import SimFleet

NAME = "gpubot-bench"
REGISTRY = Path(tempfile.gettempdir()) / "gpubot-bench-user.json"
LOCK = Path(tempfile.gettempdir()) / "gpubot-bench-user.lock"


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, list[list[int]] | bool]]:
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            reg = json.loads(REGISTRY.read_text())
        except (OSError, ValueError):
            reg = {"runs": [], "created": False}
        reg["runs"] = [r for r in reg["runs"] if simstate.is_alive(r[0], r[1])]
        yield reg
        REGISTRY.write_text(json.dumps(reg))
    finally:
        os.close(fd)


@contextlib.contextmanager
def bench_user() -> Iterator[str | None]:
    """Make sure ``gpubot-bench`` exists while the block runs; yield its name (None if not root)."""
    if os.geteuid() != 0:
        yield None
        return
    me = [os.getpid(), simstate.start_ticks(os.getpid()) or 0]
    with _registry() as reg:
        runs = reg["runs"]
        assert isinstance(runs, list)
        runs.append(me)
        try:
            pwd.getpwnam(NAME)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/bin/sh",
                    "--user-group",
                    "--password",
                    "*",
                    NAME,
                ],
                check=True,
                capture_output=True,
            )
            reg["created"] = True
    try:
        yield NAME
    finally:
        with _registry() as reg:
            runs = reg["runs"]
            assert isinstance(runs, list)
            reg["runs"] = [r for r in runs if r != me]
            if not reg["runs"] and reg["created"]:
                subprocess.run(["userdel", NAME], capture_output=True)
                reg["created"] = False


def fleet_as(fleet: SimFleet, user: str | None) -> SimFleet:
    """Make a not yet started fleet log in as ``user`` (its sshd and workloads use that user)."""
    if user is None:
        return fleet
    # SimFleet takes its login user from the effective uid; the benchmark (root) wants another.
    fleet.login_as(user)
    return fleet
