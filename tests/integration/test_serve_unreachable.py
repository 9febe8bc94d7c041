"""``gpubot serve`` with Slack out of reach (issue 25): one line each, never a traceback, and the
bot still ends on SIGTERM while Socket Mode keeps trying.

Slack's Web API is a port on 127.0.0.1 that nothing listens on (``SLACK_API_URL``): a firewall or
a wrong URL, as a newcomer behind a proxy meets it. Before, ``check_token`` let aiohttp's
connection error through as an 85-line traceback, Socket Mode logged one on every retry, and a
SIGTERM during the retries was never acted on.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from gpubot.slack.outage import OneLineUnreachable

TOKENS = {
    "SLACK_BOT_TOKEN": "xoxb-1111-2222-abcdefabcdef",
    "SLACK_APP_TOKEN": "xapp-1-A111-222-abcdef",
    "SLACK_SIGNING_SECRET": "0123456789abcdef0123456789abcdef",
}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    config = tmp_path / "gpubot.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n'
        '[[nodes]]\nname = "n1"\nhost = "127.0.0.1"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    env |= TOKENS | {"SLACK_API_URL": f"http://127.0.0.1:{_closed_port()}/api/"}
    argv = [sys.executable, "-m", "gpubot", "--config", str(config), "serve", "--no-sweeps"]
    return subprocess.Popen(
        [*argv, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )


def _until_stopped(proc: subprocess.Popen[str], seen: str, within_s: float) -> tuple[int, str]:
    """Read stderr until ``seen`` shows, SIGTERM the bot (by its pid), return (status, stderr)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if seen in line:
                proc.send_signal(signal.SIGTERM)
                _, rest = proc.communicate(timeout=15)
                return proc.returncode, "".join(lines) + rest
        raise AssertionError(f"{seen!r} never showed:\n{''.join(lines)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()  # a timed-out communicate leaves it open, to warn in a later test


@pytest.mark.parametrize(
    ("args", "seen"),
    [(("--http", "--port", "0"), "serving Slack at"), ((), "Failed to connect")],
    ids=["http", "socket-mode"],
)
def test_serve_says_slack_is_unreachable_in_one_line_and_stops_on_sigterm(
    tmp_path: Path, args: tuple[str, ...], seen: str
) -> None:
    if args:  # HTTP: a free port of its own (0 is refused as a port number)
        args = ("--http", "--port", str(_closed_port()))
    status, err = _until_stopped(_serve(tmp_path, *args), seen, within_s=60)
    assert status == 0, err
    assert "Traceback" not in err, err
    assert "cannot reach the Slack Web API yet (ClientConnectorError): starting anyway" in err


def _record(exc: BaseException) -> logging.LogRecord:
    info = (type(exc), exc, None)
    return logging.LogRecord("x", logging.ERROR, __file__, 1, "Failed to connect", None, info)


def test_the_filter_drops_only_an_unreachable_slack_s_traceback() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("h", 9, False, True, None, None, None)
    unreachable = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))
    for exc, kept in ((unreachable, False), (TimeoutError(), False), (ValueError("bug"), True)):
        record = _record(exc)
        assert OneLineUnreachable().filter(record)
        assert (record.exc_info is not None) is kept, exc
