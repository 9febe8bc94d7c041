"""An approved kill interrupted by a crash and a restart within the lease's ttl (the usual
supervisor restart) is reported once its lease lapses (issue 34).

A process runs the app's lifecycle with the bot's real approval duty, as ``gpubot serve`` does
(``approval_restart_main``), on the simulated fleet, a SQLite database and the loopback fake
Slack. It approves a forced kill of a stubborn process and is SIGKILLed (by PID) in the grace
wait; a second one starts before the lease lapses. Control: at its start-up the lease is still
in force, so the start-up look (the only one before) skips it: the approval is still
``approved`` and nothing is posted; once the lease lapses the duty marks it ``incomplete`` and
tells its thread and its requester, once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gpubot.store import open_store
from tests.fixtures.slack import FakeSlack, workload_owner

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 12.0  # approval_restart_main's lease (longer than a restart on a loaded box: 5.6 s seen)


class Child:
    """One ``approval_restart_main`` process and the events it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []

    async def until(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        """Read lines until ``event``; return it."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                assert line, f"the child ended before {event!r}: {self.events}"
                self.events.append(json.loads(line))
                if self.events[-1]["event"] == event:
                    return self.events[-1]


async def start(fleet: Any, url: str, fake: FakeSlack, mode: str) -> Child:
    argv = [sys.executable, "-m", "tests.integration.approval_restart_main"]
    argv += [str(fleet.config_path), url, fake.base_url, workload_owner(fleet), mode]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUBOT_CONFIG", None)
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
    )
    return Child(proc)


async def stop(child: Child) -> None:
    """Stop a child this test started, by its pid."""
    if child.proc.returncode is None:
        os.kill(child.proc.pid, signal.SIGKILL)
    await child.proc.wait()


def state_of(url: str, approval_id: int) -> str:
    """Return an approval's state, read through a store of the test's own."""
    store = open_store(url)
    try:
        with store.engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT state FROM approvals WHERE id = :i"), {"i": approval_id}
            ).one()
        return str(row[0])
    finally:
        store.close()


async def sigterm_sent(url: str) -> bool:
    """Whether the interrupted reset recorded its SIGTERM (it is then in its grace wait)."""
    store = open_store(url)
    try:
        for a in await store.incomplete_actions():
            d = await store.action(a.id)
            if d is not None and any(e.data.get("kind") == "signal" for e in d.events):
                return True
        return False
    finally:
        store.close()


async def wait_until(check: Any, timeout: float, what: str) -> None:
    """Poll the async ``check`` until it holds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def _thread_posts(fake: FakeSlack, ts: str) -> list[dict[str, Any]]:
    return [c.body for c in fake.of("chat.postMessage") if c.body.get("thread_ts") == ts]


async def test_a_killed_approved_kill_is_reported_once_its_lease_lapses(
    slack_fleet: Any, node1: Any, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    open_store(url).close()  # the new SQLite file sets itself up first
    w = node1.spawn(gpu=0, mib=2048, behaviour="stubborn")
    first = await start(slack_fleet, url, fake_slack, "approve")
    second: Child | None = None
    try:
        asked = await first.until("approving")
        aid, ts = int(asked["approval"]), str(asked["ts"])
        await wait_until(lambda: sigterm_sent(url), 60, "the SIGTERM")  # in its grace wait
        killed_at = time.monotonic()
        await stop(first)
        second = await start(slack_fleet, url, fake_slack, "serve")
        await second.until("ready")
        # restarted while the killed holder's lease is in force (it lapses ttl after its last
        # renewal, at most 0.5 s before the kill): the control below needs that
        assert time.monotonic() - killed_at < TTL_S - 1.0
        # Control: at start-up the killed holder's lease was in force; the start-up look
        # skipped it, as the only look before did: nothing told, still "approved".
        assert state_of(url, aid) == "approved" and _thread_posts(fake_slack, ts) == []
        await fake_slack.wait_for(lambda: state_of(url, aid) == "incomplete", timeout=30)
        # not before the lease lapsed (ttl after its last renewal, at most 0.5 s before the kill)
        assert time.monotonic() - killed_at >= TTL_S - 1.0
        await fake_slack.wait_for(lambda: len(_thread_posts(fake_slack, ts)) == 1, timeout=15)
        await asyncio.sleep(1.5)  # several more runs of the duty: told once
        (told,) = _thread_posts(fake_slack, ts)
        said = json.dumps(told)
        assert "was interrupted" in said and "marked incomplete" in said
        assert "<@U0OWNER>" in said and "<@U0CAROL>" in said  # the requester and approver named
        shown = [c for c in fake_slack.of("chat.update") if c.body.get("ts") == ts]
        assert "interrupted: gpubot stopped while running it" in json.dumps(shown[-1].body)
        # (its DM to the requester needs conversations.open, which the fake does not answer:
        # tests/unit/test_approval_retry.py shows it)
        assert w.alive()  # the stubborn process was never SIGKILLed by a second run
    finally:
        await stop(first)
        if second is not None:
            await stop(second)
