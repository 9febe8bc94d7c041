"""The identity-checked signal script, run by a real sh against real processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.core.reset.signals import PidReport, parse_signal_output, signal_argv
from gpubot.core.reset.signals import PidStatus as S
from gpubot.errors import ParseError
from tests.procs import start_ticks, wait_zombie

ME = os.geteuid()  # the owner of the processes the tests start
SHELLS = [sh for sh in ("dash", "bash") if shutil.which(sh)]


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
            signal_argv("check", [(sleeper.pid, start_ticks(sleeper.pid), ME)], sudo=False),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )[sleeper.pid]
    assert rep.status == "alive" and rep.state in {"S", "R"}


def test_term_reaches_the_right_process(sleeper: subprocess.Popen[bytes]) -> None:
    argv = signal_argv("TERM", [(sleeper.pid, start_ticks(sleeper.pid), ME)], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "sent"
    assert sleeper.wait(5) == -signal.SIGTERM


def test_a_reused_pid_is_never_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    wrong = (
        start_ticks(sleeper.pid) - 1
    )  # as if the planned process had died and the PID was reused
    argv = signal_argv("KILL", [(sleeper.pid, wrong, ME)], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "reused"
    time.sleep(0.1)
    assert sleeper.poll() is None


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("sig", ["KILL", "TERM", "check"])
def test_another_owner_is_never_signalled(
    sleeper: subprocess.Popen[bytes], shell: str, sig: str
) -> None:
    """The planned owner differs from the process's effective uid: reported, not signalled."""
    planned = ME + 4242  # as if the pid now ran as someone else than the plan saw
    argv = signal_argv(sig, [(sleeper.pid, start_ticks(sleeper.pid), planned)], sudo=False)
    assert argv[0] == "sh"
    argv[0] = shell
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out == f"{sleeper.pid} owner {ME}\n"
    rep = parse_signal_output(out)[sleeper.pid]
    assert (rep.status, rep.uid) == ("owner", ME)
    assert rep.why is not None and f"uid {ME}" in rep.why and "not signalled" in rep.why
    time.sleep(0.1)
    assert sleeper.poll() is None  # still alive
    # the right owner in the same exec, under the same shell, is signalled
    argv = signal_argv("TERM", [(sleeper.pid, start_ticks(sleeper.pid), ME)], sudo=False)
    argv[0] = shell
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "sent"
    assert sleeper.wait(5) == -signal.SIGTERM


def test_each_identity_is_checked_on_its_own(sleeper: subprocess.Popen[bytes]) -> None:
    other = subprocess.Popen(["sleep", "30"])
    try:
        ticks, other_ticks = start_ticks(sleeper.pid), start_ticks(other.pid)
        argv = signal_argv(
            "KILL", [(other.pid, other_ticks, ME + 1), (sleeper.pid, ticks, ME)], sudo=False
        )
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        reports = parse_signal_output(out)
        assert reports[other.pid].status == "owner" and reports[sleeper.pid].status == "sent"
        assert sleeper.wait(5) == -signal.SIGKILL
        time.sleep(0.1)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_gone_and_zombie_count_as_gone() -> None:
    p = subprocess.Popen(["sleep", "30"])
    ticks = start_ticks(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    wait_zombie(p.pid)  # killed, not reaped yet
    argv = signal_argv("check", [(p.pid, ticks, ME)], sudo=False)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[p.pid].status == "gone"
    p.wait()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert parse_signal_output(out)[p.pid].status == "gone"


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        signal_argv("HUP; rm -rf /", [(1, 1, 0)], sudo=False)
    bad = [(0, 5, 1000), (-1, 5, 1000), (7, -1, 1000), (7, 5, -1)]
    assert signal_argv("TERM", bad, sudo=False)[7:] == []
    assert signal_argv("KILL", [(7, 5, 0), (8, 9, 1000)], sudo=True)[4:] == [
        "KILL",
        "1",
        "",  # no line for the node's log
        "7:5:0",
        "8:9:1000",
    ]


@pytest.mark.parametrize(
    "line",
    [
        "abc gone",
        "12",
        "12 alive S",
        "12 exploded",
        "12 owner",
        "12 owner x",
        "12 owner -1",
        "12 owner 5 6",
        "12 gone 5",
        "12 sent 0",
    ],
)
def test_parser_is_strict(line: str) -> None:
    with pytest.raises(ParseError):
        parse_signal_output(line)


def test_parser_reads_every_status() -> None:
    out = "1 gone\n2 reused\n3 owner 1001\n4 alive D uvm_wait\n5 alive S 0\n6 sent\n7 failed\n"
    assert parse_signal_output(out) == {
        1: PidReport(1, S.GONE),
        2: PidReport(2, S.REUSED),
        3: PidReport(3, S.OWNER, uid=1001),
        4: PidReport(4, S.ALIVE, "D", "uvm_wait"),
        5: PidReport(5, S.ALIVE, "S", None),
        6: PidReport(6, S.SENT),
        7: PidReport(7, S.FAILED),
    }


@pytest.mark.parametrize(
    ("report", "why"),
    [
        (PidReport(1, S.REUSED), "the pid was reused; not signalled"),
        (
            PidReport(1, S.OWNER, uid=1001),
            "its owner is now uid 1001, not the planned owner; not signalled",
        ),
        (PidReport(1, S.FAILED), "kill failed on the node"),
        (PidReport(1, S.SENT), None),
        (PidReport(1, S.GONE), None),
        (PidReport(1, S.ALIVE, "S"), None),
    ],
)
def test_why(report: PidReport, why: str | None) -> None:
    if why is None:
        assert report.why is None
    else:
        assert report.why is not None and report.why.endswith(why)


def test_sudo_nodes_signal_through_sudo_n(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    log = tmp_path / "sudo.log"
    fake = tmp_path / "sudo"  # records its arguments, then runs the command without privilege
    fake.write_text(f'#!/bin/sh\nprintf \'%s \' "$@" >> {log}\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    argv = signal_argv("TERM", [(sleeper.pid, start_ticks(sleeper.pid), ME)], sudo=True)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    assert parse_signal_output(out)[sleeper.pid].status == "sent"
    assert log.read_text().split() == ["-n", "kill", "-s", "TERM", str(sleeper.pid)]
    assert sleeper.wait(5) == -signal.SIGTERM
