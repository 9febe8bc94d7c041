"""``gpubot serve`` as a real process: token checks at start-up, Socket Mode and HTTP modes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.store import open_store
from tests.fixtures.slack import (
    APP_TOKEN,
    BOT_TOKEN,
    SECRET,
    SLACK_EXTRA,
    FakeSlack,
    SlackSender,
    users_table,
    workload_owner,
)

REPO = Path(__file__).resolve().parents[2]


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)


@pytest.fixture(scope="module")
def config(slack_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's settings file with a migrated database and the Slack tables."""
    folder = tmp_path_factory.mktemp("serve")
    db = f"sqlite:///{folder}/audit.db"
    store = open_store(db, check_schema=False)
    store.upgrade()
    store.close()
    text = slack_fleet.config_path.read_text()
    start = text.index('url = "', text.index("[database]"))
    end = text.index("\n", start)
    text = text[:start] + f'url = "{db}"' + text[end:]
    extra = {**SLACK_EXTRA, "users": users_table(workload_owner(slack_fleet))}
    for table, values in extra.items():
        text += f"\n[{table}]\n" + "".join(f'"{k}" = {toml_value(v)}\n' for k, v in values.items())
    path = folder / "gpubot.toml"
    path.write_text(text)
    return path


def env_with(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env.update(values)
    return env


async def run_serve(config: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpubot",
        "--config",
        str(config),
        "serve",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({}, (), "SLACK_BOT_TOKEN is not set"),
        ({"SLACK_BOT_TOKEN": "xoxp-user-token"}, (), "SLACK_BOT_TOKEN is malformed"),
        ({"SLACK_BOT_TOKEN": BOT_TOKEN}, (), "SLACK_APP_TOKEN is not set"),
        (
            {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": "xoxb-wrong-kind"},
            (),
            "SLACK_APP_TOKEN is malformed",
        ),
        ({"SLACK_BOT_TOKEN": BOT_TOKEN}, ("--http",), "SLACK_SIGNING_SECRET is not set"),
        (
            {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": "not hex!"},
            ("--http",),
            "SLACK_SIGNING_SECRET is malformed",
        ),
        (
            {
                "SLACK_BOT_TOKEN": BOT_TOKEN,
                "SLACK_APP_TOKEN": APP_TOKEN,
                "SLACK_API_URL": "ftp://x",
            },
            (),
            "SLACK_API_URL is malformed",
        ),
    ],
)
async def test_bad_tokens_one_line_and_nonzero_exit(
    config: Path, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    code, err = await run_serve(config, env_with(**env), *args)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpubot: error: ") and message in lines[0]
    assert "xoxp-user-token" not in err and "Traceback" not in err


async def test_database_behind_refused_at_start(
    config: Path, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    text = config.read_text()
    start = text.index('url = "', text.index("[database]"))
    behind = tmp_path / "gpubot.toml"
    behind.write_text(
        text[:start] + f'url = "sqlite:///{tmp_path}/behind.db"' + text[text.index("\n", start) :]
    )
    # A new SQLite file would set itself up: this one was migrated, then taken back to base.
    store = open_store(f"sqlite:///{tmp_path}/behind.db", check_schema=False)
    store.upgrade()
    store.downgrade("base")
    store.close()
    env = env_with(
        SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_APP_TOKEN=APP_TOKEN, SLACK_API_URL=fake_slack.base_url
    )
    code, err = await run_serve(behind, env)
    assert code != 0
    (line,) = err.strip().splitlines()
    assert line.startswith("gpubot: error: ") and "gpubot db upgrade" in line
    assert fake_slack.calls == []  # it stopped before talking to Slack


async def test_token_refused_by_slack(config: Path, fake_slack: FakeSlack) -> None:
    env = env_with(
        SLACK_BOT_TOKEN="xoxb-revoked-token-1",
        SLACK_APP_TOKEN=APP_TOKEN,
        SLACK_API_URL=fake_slack.base_url,
    )
    code, err = await run_serve(config, env)
    assert code != 0
    assert "SLACK_BOT_TOKEN was refused by Slack: invalid_auth" in err.strip().splitlines()[-1]
    assert fake_slack.of("auth.test")


@pytest.fixture
async def served(
    config: Path, fake_slack: FakeSlack, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """Run ``gpubot serve`` (args from the test's parameter) until the test ends."""
    mode = request.param
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = env_with(
        SLACK_BOT_TOKEN=BOT_TOKEN,
        SLACK_APP_TOKEN=APP_TOKEN,
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=fake_slack.base_url,
    )
    args = ("--http", "--port", str(port)) if mode == "http" else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpubot",
        "--config",
        str(config),
        "serve",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # the process this test started, by pid
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.mark.parametrize("served", ["socket"], indirect=True)
async def test_socket_mode_end_to_end(
    served: tuple[asyncio.subprocess.Process, int], fake_slack: FakeSlack
) -> None:
    proc, _ = served
    await fake_slack.wait_for(lambda: bool(fake_slack.sockets), timeout=40)
    (opened,) = fake_slack.of("apps.connections.open")
    assert opened.headers["Authorization"] == f"Bearer {APP_TOKEN}"
    sender = SlackSender("unused", fake=fake_slack)
    command = dict(urllib.parse.parse_qsl(sender.command_body("status node1", user="U0BOB")))
    await fake_slack.socket_send("slash_commands", command, "env-1")
    await fake_slack.wait_for(
        lambda: any(m.get("envelope_id") == "env-1" for m in fake_slack.socket_received)
    )
    await fake_slack.wait_for(lambda: bool(fake_slack.ok("chat.update")))
    update = fake_slack.ok("chat.update")[-1]
    assert update.body["channel"] == "C0GENERAL" and update.body["text"].startswith("node1:")
    bad = dict(urllib.parse.parse_qsl(sender.command_body("reset", user="U0BOB")))
    await fake_slack.socket_send("slash_commands", bad, "env-2")
    await fake_slack.wait_for(
        lambda: any(m.get("envelope_id") == "env-2" for m in fake_slack.socket_received)
    )
    ack = next(m for m in fake_slack.socket_received if m["envelope_id"] == "env-2")
    assert "reset needs a node" in ack["payload"]["text"]  # the usage error is the ack
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0


@pytest.mark.parametrize("served", ["http"], indirect=True)
async def test_http_mode_end_to_end(
    served: tuple[asyncio.subprocess.Process, int], fake_slack: FakeSlack
) -> None:
    proc, port = served
    assert proc.stderr is not None
    line = b"-"
    while line and b"serving Slack" not in line:
        line = await asyncio.wait_for(proc.stderr.readline(), 40)
    assert f"http://127.0.0.1:{port}/slack/events".encode() in line
    sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, fake_slack)
    assert (await sender.command("status node1", user="U0BOB")).status == 200
    await fake_slack.wait_for(lambda: bool(fake_slack.ok("chat.update")))
    forged = await sender.send(
        sender.command_body("status"),
        "application/x-www-form-urlencoded",
        signature="v0=" + "1" * 64,
    )
    assert forged.status == 401
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
