"""``kill -USR1`` of a running ``gpubot serve`` logs what every task and thread waits on, and
the bot goes on serving (issue 22: a way to see what a stalled bot is waiting on)."""

from __future__ import annotations

import asyncio
import signal

import pytest

# the fixtures of the serve tests: a real `gpubot serve` process on the fake Slack
from tests.fixtures.serve import config as config
from tests.fixtures.serve import served as served
from tests.fixtures.slack import SECRET, FakeSlack, SlackSender


async def _until(stream: asyncio.StreamReader, marker: bytes) -> list[bytes]:
    lines: list[bytes] = []
    while not lines or marker not in lines[-1]:
        line = await asyncio.wait_for(stream.readline(), 40)
        assert line, b"".join(lines).decode(errors="replace")[-2000:]
        lines.append(line)
    return lines


@pytest.mark.parametrize("served", ["http"], indirect=True)
async def test_sigusr1_logs_tasks_and_threads_and_serving_goes_on(
    served: tuple[asyncio.subprocess.Process, int], fake_slack: FakeSlack
) -> None:
    proc, port = served
    assert proc.stderr is not None
    await _until(proc.stderr, b"serving Slack")
    proc.send_signal(signal.SIGUSR1)  # the process this test started, by pid
    await _until(proc.stderr, b"SIGUSR1: what gpubot is waiting on")
    dump = b"".join(await _until(proc.stderr, b"--- thread 'MainThread'")).decode()
    assert "asyncio task(s):" in dump and "(pending)" in dump
    assert "coro=<_serve()" in dump  # the main task and where it waits: serving Slack
    assert "thread(s):" in dump
    sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, fake_slack)
    helped = await sender.command("help", user="U0BOB")
    assert helped.status == 200 and "/gpu" in helped.text
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
