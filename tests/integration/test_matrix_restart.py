"""``gpubot serve --chat matrix`` SIGKILLed after its approval request reached the room but
before it heard so, then started again: the request is one event (the outbox's token is the
transaction id, found again or resent as the same event), and the approved reset runs once.

The answer is lost on purpose: a loopback proxy between the bot and Synapse passes the request
on and drops what Synapse answers, the way a crash between send and record loses it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubot.matrix.render import APPROVAL_KEY
from gpubot.services.outbox import SETTLE_S
from gpubot.store import open_store
from gpubot.store.records import iso
from gpubot.store.tables import outbox
from tests.fixtures.matrix import MatrixWorld, config_for, serving
from tests.procs import alive

MARK = APPROVAL_KEY.encode()  # in the body of the request's PUT


class LosingProxy:
    """127.0.0.1:port → Synapse; the answer to the first PUT carrying ``MARK`` is dropped."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.armed = True
        self.lost = asyncio.Event()
        self.port = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection (the tasks this proxy made, by reference)."""
        if self.server is not None:
            self.server.close()
        for w in self.writers:
            w.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        self.writers.append(writer)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers.append(up_w)
        losing = False

        async def out() -> None:
            nonlocal losing
            try:
                while data := await reader.read(65536):
                    if self.armed and MARK in data:
                        self.armed, losing = False, True
                        self.lost.set()
                    up_w.write(data)
                    await up_w.drain()
            finally:
                up_w.close()  # the bot went: so does the connection to Synapse

        async def back() -> None:
            try:
                while data := await up_r.read(65536):
                    if not losing:
                        writer.write(data)
                        await writer.drain()
            finally:
                writer.close()

        try:
            await asyncio.gather(out(), back(), return_exceptions=True)
        finally:
            for w in (writer, up_w):
                w.close()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await w.wait_closed()


async def requests_in(world: MatrixWorld) -> list[dict[str, Any]]:
    alice = world.users["alice"]
    return [
        e for e in await alice.from_user(world.room, world.bot_id) if APPROVAL_KEY in e["content"]
    ]


@pytest.mark.timeout(300)
async def test_a_bot_killed_after_posting_makes_no_second_event_and_resets_once(
    matrix_world: MatrixWorld, slack_fleet: Any, node1: Any, tmp_path: Path
) -> None:
    world = matrix_world
    proxy = LosingProxy(world.synapse.port)
    await proxy.start()
    try:
        await restarted(world, slack_fleet, node1, tmp_path, proxy)
    finally:
        await proxy.close()


async def restarted(
    world: MatrixWorld, slack_fleet: Any, node1: Any, tmp_path: Path, proxy: LosingProxy
) -> None:
    bob, carol = world.users["bob"], world.users["carol"]
    config = config_for(world, slack_fleet, tmp_path, f"http://127.0.0.1:{proxy.port}")
    w = node1.spawn(gpu=2, mib=3000)
    async with serving(config, world.bot_token) as first:
        await bob.say(world.room, "!gpu reset node1 gpu 2")
        await asyncio.wait_for(proxy.lost.wait(), 60)
        await bob.wait_for(world.room, world.bot_id, lambda e: APPROVAL_KEY in e["content"])
        first.kill()  # SIGKILL, by the pid this test started: the answer never came
        await first.wait()
    (request,) = await requests_in(world)
    db = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
    try:  # the killed bot never heard the answer: its post is pending, where it landed unknown
        assert len(await db.outbox.pending("approval:", under=True)) == 1
        before = await db.approvals.get(1)
        assert before is not None and before.ref is None
        # The bot stays down past the outbox's settle time (SETTLE_S): its take is as old as
        # that, rather than this test waiting out the minute.
        aged = iso(datetime.now(UTC) - timedelta(seconds=SETTLE_S + 1))
        with db.engine.begin() as conn:
            conn.execute(outbox.update().where(outbox.c.state == "pending").values(taken_at=aged))
    finally:
        db.close()
    async with serving(config, world.bot_token):
        # The duty settles the post left pending (its take older than SETTLE_S): found, adopted.
        db = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
        try:
            for _ in range(150):
                if not await db.outbox.pending("approval:", under=True):
                    break
                await asyncio.sleep(1)
            assert not await db.outbox.pending("approval:", under=True)
        finally:
            db.close()
        assert [e["event_id"] for e in await requests_in(world)] == [request["event_id"]]
        db = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
        try:  # adopted: found by its transaction id
            approval = await db.approvals.get(1)
            assert approval is not None and approval.ref == f"{world.room}/{request['event_id']}"
        finally:
            db.close()
        await carol.react(world.room, request["event_id"], "✅")
        await bob.wait_for(
            world.room,
            world.bot_id,
            lambda e: (
                e["content"].get("m.relates_to", {}).get("event_id") == request["event_id"]
                and "freed" in e["content"].get("m.new_content", {}).get("body", "")
            ),
        )
    assert not alive(w.pid)
    assert [e["event_id"] for e in await requests_in(world)] == [request["event_id"]]
    db = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
    try:
        freed = [a for a in await db.actions() if a.kind == "reset" and a.status == "freed"]
    finally:
        db.close()
    assert len(freed) == 1 and freed[0].actor == carol.user_id
