"""The identity-checked signal script, run by a real sh against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.core.signals import parse_signal_output, signal_argv
from gpubot.errors import ParseError


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat.rsplit(")", 1)[1].split()[19])


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


def test_check_reports_alive_with_state(sleeper: subprocess.Popen[bytes]) -> None:
    rep = parse_signal_output(
        subprocess.run(
            signal_argv("check", [(sleeper.pid, start_ticks(sleeper.pid))], sudo=False),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )[sleeper.pid]
    assert rep.status == "alive" and rep.state in {"S", "R"}


def test_term_reaches_the_right_process(sleeper: subprocess.Popen[bytes]) -> None:
    argv = signal_argv("TERM", [(sleeper.pid, start_ticks(sleeper.pid))], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "sent"
    assert sleeper.wait(5) == -signal.SIGTERM


def test_a_reused_pid_is_never_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    wrong = (
        start_ticks(sleeper.pid) - 1
    )  # as if the planned process had died and the PID was reused
    argv = signal_argv("KILL", [(sleeper.pid, wrong)], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "reused"
    time.sleep(0.1)
    assert sleeper.poll() is None


def test_gone_and_zombie_count_as_gone() -> None:
    p = subprocess.Popen(["sleep", "30"])
    ticks = start_ticks(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    time.sleep(0.2)  # now a zombie: not reaped yet
    argv = signal_argv("check", [(p.pid, ticks)], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[p.pid].status == "gone"
    p.wait()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[p.pid].status == "gone"


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        signal_argv("HUP; rm -rf /", [(1, 1)], sudo=False)
    assert signal_argv("TERM", [(0, 5), (-1, 5)], sudo=False)[6:] == []


@pytest.mark.parametrize("line", ["abc gone", "12", "12 alive S", "12 exploded"])
def test_parser_is_strict(line: str) -> None:
    with pytest.raises(ParseError):
        parse_signal_output(line)


def test_sudo_nodes_signal_through_sudo_n(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    log = tmp_path / "sudo.log"
    fake = tmp_path / "sudo"  # records its arguments, then runs the command without privilege
    fake.write_text(f'#!/bin/sh\nprintf \'%s \' "$@" >> {log}\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    argv = signal_argv("TERM", [(sleeper.pid, start_ticks(sleeper.pid))], sudo=True)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "sent"
    assert log.read_text().split() == ["-n", "kill", "-s", "TERM", str(sleeper.pid)]
    assert sleeper.wait(5) == -signal.SIGTERM
