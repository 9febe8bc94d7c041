"""``gpubot serve`` on a port that is taken fails to start in one line naming the port and what
to change, with the exit status of a configuration error (the one the systemd unit's
``RestartPreventExitStatus=`` names), never a traceback (issue 33: 48 lines for the HTTP port).

Real processes: the port is held by a socket of the test's own on 127.0.0.1, and ``gpubot
serve`` runs as a subprocess against a fake Slack Web API on loopback. The control frees the
port: the same command then serves, and ends with 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.cli import EXIT_ERROR
from gpusim.fleet import SimFleet
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.slack import BOT_TOKEN, SECRET, FakeSlack


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with SimFleet(tmp_path_factory.mktemp("serve-ports"), nodes=1, gpus=1) as f:
        path = f.config_path.with_name("serve.toml")  # a channel: no warning at start
        path.write_text(f'[slack]\nchannel = "C0GENERAL"\n\n{f.config_path.read_text()}')
        done = gpubot_cli(path, "db", "upgrade")
        assert done.returncode == 0, done.stderr
        yield path


@pytest.fixture
def held() -> Iterator[int]:
    """A port on 127.0.0.1 that a listening socket of this test holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environ(fake: FakeSlack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env |= {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET}
    return env | {"SLACK_API_URL": fake.base_url}


async def serve(config: Path, env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gpubot", "--config", str(config), "serve", "--http"),
        *("--no-sweeps", *args),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def failed_start(config: Path, env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    proc = await serve(config, env, *args)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode().splitlines()


async def test_a_busy_http_port_is_one_line(config: Path, fake_slack: FakeSlack, held: int) -> None:
    code, lines = await failed_start(config, environ(fake_slack), "--port", str(held))
    assert code == EXIT_ERROR, lines
    (line,) = lines  # not the traceback of issue 33
    assert line.startswith(f"gpubot: error: cannot serve Slack on 127.0.0.1:{held}: "), line
    assert "in use" in line and "choose another --port" in line


async def test_a_busy_metrics_port_is_one_line(
    config: Path, fake_slack: FakeSlack, held: int
) -> None:
    args = ("--port", str(free_port()), "--metrics-port", str(held))
    code, lines = await failed_start(config, environ(fake_slack), *args)
    assert code == EXIT_ERROR, lines
    (line,) = lines
    assert line.startswith(f"gpubot: error: cannot serve metrics on 127.0.0.1:{held}: "), line
    assert "--metrics-port" in line and "[metrics] port" in line


async def test_control_a_free_port_serves(config: Path, fake_slack: FakeSlack) -> None:
    """The same command with nothing on its port starts, serves and ends with 0 on SIGTERM."""
    port = free_port()
    proc = await serve(config, environ(fake_slack), "--port", str(port))
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert line.decode().startswith(f"gpubot: serving Slack at http://127.0.0.1:{port}/")
    finally:
        proc.send_signal(signal.SIGTERM)  # the gpubot this test started, by its PID
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0


async def test_a_missing_token_is_the_configuration_error_status(
    config: Path, fake_slack: FakeSlack
) -> None:
    """The unit's ``RestartPreventExitStatus=`` stops the restart loop of a missing token only
    if that is the status it ends with."""
    env = {k: v for k, v in environ(fake_slack).items() if k != "SLACK_BOT_TOKEN"}
    code, lines = await failed_start(config, env, "--port", str(free_port()))
    assert code == EXIT_ERROR and len(lines) == 1 and "SLACK_BOT_TOKEN is not set" in lines[0]
