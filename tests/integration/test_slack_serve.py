"""``gpubot serve`` as a real process: token checks at start-up, Socket Mode and HTTP modes."""

from __future__ import annotations

import asyncio
import signal
import urllib.parse
from pathlib import Path

import pytest

from gpubot.store import open_store
from tests.fixtures.serve import config as config
from tests.fixtures.serve import env_with, run_serve
from tests.fixtures.serve import served as served
from tests.fixtures.slack import (
    APP_TOKEN,
    BOT_TOKEN,
    SECRET,
    FakeSlack,
    SlackSender,
)


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
