"""A reset whose output goes away (``gpubot reset … 2>&1 | head -2``, a closed terminal, SIGHUP)
still runs to its outcome: SIGKILL after the grace, verify, and the outcome in the audit log
(issue 33: it stopped after SIGTERM, a stubborn process alive, the audit saying "Broken pipe").

Real processes throughout: the simulated fleet over SSH, a holder that ignores SIGTERM, and
``gpubot reset`` as a real process whose stdout and stderr are one pipe that the test reads the
plan from and then closes. The controls show the mechanism the defence exists for: a write to
a closed pipe raises ``BrokenPipeError``, and SIGHUP ends a process that does not hold it off.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load
from gpubot.store import open_store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli, leave_clean
from tests.procs import alive

GRACE_S = "3"  # long enough to close the pipe (or hang up) between SIGTERM and SIGKILL


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("reset-output"), nodes=1, gpus=2) as f:
        done = gpubot_cli(f.config_path, "db", "upgrade")
        assert done.returncode == 0, done.stderr
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    leave_clean(n)


def start_reset(config: Path, gpu: int) -> subprocess.Popen[bytes]:
    """Start ``gpubot reset node1 --gpu N --yes --force`` with stdout and stderr one pipe
    (``2>&1 | head``), in a session of its own (no terminal of the test's to hang up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOT_", "SLACK_"))}
    argv = [sys.executable, "-m", "gpubot", "--config", str(config), "reset", "node1"]
    argv += ["--gpu", str(gpu), "--grace", GRACE_S, "--yes", "--force"]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def read_until(proc: subprocess.Popen[bytes], word: bytes, timeout_s: float = 60) -> bytes:
    """Read the reset's output until ``word`` shows (the pipe stays open)."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout_s
    while word not in seen:
        assert time.monotonic() < deadline, f"no {word!r} in: {seen.decode()}"
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"gpubot reset ended early: {seen.decode()}"
            seen += chunk
    return seen


def newest_action(config: Path, gpu: int) -> Any:
    """Return the newest reset of node1 GPU ``gpu`` in the audit log, with its events."""
    store = open_store(load(config).database_url)
    try:

        async def read() -> Any:
            action = next(a for a in await store.actions(node="node1") if a.gpus == (gpu,))
            return await store.action(action.id)

        return asyncio.run(read())
    finally:
        store.close()


def assert_ran_to_its_outcome(config: Path, gpu: int, pid: int, cut_at: datetime) -> None:
    """The holder was SIGKILLed after the output went away, verify ran, the outcome is audited."""
    assert not alive(pid)  # it ignores SIGTERM: only the SIGKILL ended it
    detail = newest_action(config, gpu)
    assert detail.summary.status == "freed", detail.result
    kills = [e for e in detail.events if e.data.get("signal") == "SIGKILL"]
    assert [(e.data["pid"], e.data["result"]) for e in kills if e.data["kind"] == "signal"] == [
        (pid, "sent")
    ]
    assert all(e.time > cut_at for e in kills)  # sent after nothing could be printed any more
    assert any(e.data.get("kind") == "verifying" for e in detail.events)
    (verdict,) = detail.result["gpus"]
    assert verdict["outcome"] == "freed" and "error" not in detail.result
    assert "Broken pipe" not in str(detail.result)


def test_a_reset_whose_pipe_closes_after_the_plan_still_kills_and_verifies(
    fleet: SimFleet, node: SimNode
) -> None:
    holder = node.spawn(gpu=0, mib=2048, behaviour="stubborn")
    proc = start_reset(fleet.config_path, 0)
    assert proc.stdout is not None
    try:
        seen = read_until(proc, b"plan for node1")
        proc.stdout.close()  # `| head -2` is done: the reader goes away
        cut_at = datetime.now(UTC)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()  # the gpubot this test started, by its PID
            proc.wait()
    assert b"Traceback" not in seen
    assert code == 0  # the reset's own status (freed), not 141: it finished
    assert_ran_to_its_outcome(fleet.config_path, 0, holder.pid, cut_at)


def test_a_reset_that_is_hung_up_on_goes_on_to_its_outcome(fleet: SimFleet, node: SimNode) -> None:
    """SIGHUP (the terminal closed) in the grace wait: the reset goes on; its output, with no
    reader left, is dropped."""
    holder = node.spawn(gpu=1, mib=1024, behaviour="stubborn")
    proc = start_reset(fleet.config_path, 1)
    assert proc.stdout is not None
    try:
        read_until(proc, b"signal=SIGTERM")
        assert alive(holder.pid)  # in the grace wait
        os.kill(proc.pid, signal.SIGHUP)  # the gpubot this test started, by its PID
        proc.stdout.close()  # a hung-up terminal takes no more output either
        cut_at = datetime.now(UTC)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, code  # not -SIGHUP: the hangup did not end it
    assert_ran_to_its_outcome(fleet.config_path, 1, holder.pid, cut_at)


def test_control_a_write_to_a_closed_pipe_raises_broken_pipe() -> None:
    """What the reset's progress lines met before: the second line, written once the reader
    was gone, raised BrokenPipeError into the reset. Through ``Dropping`` it is dropped."""
    code = (
        "import sys\n"
        "from gpubot.cli.output import Dropping\n"
        "out = Dropping(sys.stdout) if sys.argv[1] == 'dropping' else sys.stdout\n"
        "print('plan', file=out, flush=True)\n"
        "print('SIGKILL', file=out, flush=True)\n"
        "print('went on', file=sys.stderr)\n"
    )
    got = {}
    for mode in ("raw", "dropping"):
        r, w = os.pipe()
        os.close(r)  # the reader is gone before the first line
        try:
            got[mode] = subprocess.run(
                [sys.executable, "-c", code, mode],
                stdout=w,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(w)
    raw, dropping = got["raw"], got["dropping"]
    assert raw.returncode == 1 and "BrokenPipeError" in raw.stderr
    assert "went on" not in raw.stderr  # what came after the print never ran
    assert (dropping.returncode, dropping.stderr) == (0, "went on\n")  # no "Exception ignored"


def test_control_sighup_ends_a_process_that_does_not_hold_it_off() -> None:
    code = (
        "import os, signal, sys\n"
        "from gpubot.cli.output import kept_going\n"
        "if sys.argv[1] == 'kept':\n"
        "    with kept_going():\n"
        "        os.kill(os.getpid(), signal.SIGHUP)\n"
        "else:\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "print('went on')\n"
    )
    plain = subprocess.run([sys.executable, "-c", code, "plain"], capture_output=True, timeout=60)
    kept = subprocess.run([sys.executable, "-c", code, "kept"], capture_output=True, timeout=60)
    assert plain.returncode == -signal.SIGHUP and plain.stdout == b""
    assert (kept.returncode, kept.stdout) == (0, b"went on\n")
