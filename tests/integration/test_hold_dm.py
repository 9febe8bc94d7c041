"""A hold recorded by any process is told by the running bot (issue 34).

``gpubot claim release`` from a terminal records the hold for the first in line at once (it
serves the queue), but a CLI cannot message anyone. Before, the bot's duty skipped that hold,
which read as already offered: it ran out and the waiter lost their turn without a word. Now
the bot's duty returns each live hold once per process, and Slack delivers its DM once through
the outbox (its token made from the hold: one row, whoever finds it due).

Both run as they do in use: the bot with its claims duty on the app's scheduler (``App.running``,
as ``gpubot serve`` wires it; the duty every few seconds), the CLI as a real process on the same
SQLite database. The control: with no bot running, the CLI's hold is recorded and no DM is
sent; the bot, started afterwards, delivers it, once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import load
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import WaitState
from gpubot.core.policy import Person
from gpubot.store import Store
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.slack import Call, DmSlack, FakeSlack, slack_bot, slack_front
from tests.procs import until

EVERY_S = 5  # the duty's interval: the bot needs two looks (10 s) to see the GPU free itself
NODE, GPU = "node2", 3


@pytest.fixture
def config(slack_fleet: Any, tmp_path: Path) -> Path:
    """The fleet's settings with claims on (the duty every ``EVERY_S``), bob and dave, and
    a fresh database, upgraded by ``gpubot db upgrade``."""
    db = tmp_path / "gpubot.db"
    text = Path(slack_fleet.config_path).read_text(encoding="utf-8")
    text = re.sub(r'(?m)^url = "sqlite:///.*"$', f'url = "sqlite:///{db}"', text, count=1)
    claims = f"\n[claims]\nenabled = true\nevery_s = {EVERY_S}\n"
    users = '\n[users]\nU0BOB = "bob"\nU0DAVE = "dave"\n'
    path = tmp_path / "gpubot.toml"
    path.write_text(text + claims + users, encoding="utf-8")
    assert gpubot_cli(path, "db", "upgrade").returncode == 0
    return path


@asynccontextmanager
async def app_of(config: Path, fake: FakeSlack) -> AsyncIterator[Any]:
    front = slack_front(fake)
    app = build(load(config), {}, need_store=True, front=front)
    try:
        yield app, front
    finally:
        await app.close()


@asynccontextmanager
async def bot_running(config: Path, fake: FakeSlack) -> AsyncIterator[Any]:
    """The bot with its claims duty on the app's scheduler, as ``gpubot serve`` runs it."""
    async with app_of(config, fake) as (app, front):
        bot = slack_bot(app, front, None)
        async with app.running():  # the claims' duty among the app's
            yield app
        await bot.drain()


async def queue_behind_bob(config: Path, fake: FakeSlack) -> None:
    """bob claims node2 GPU 3; dave waits for it (the bot's own flows, its own database)."""
    async with app_of(config, fake) as (app, _):
        svc = app.chat.claims
        assert svc is not None
        bob = Person("U0BOB", "bob", linux_user="bob")
        dave = Person("U0DAVE", "dave", linux_user="dave")
        await svc.claim(bob, cc.ClaimGpus(NODE, (GPU,), 0, 3600.0, ""), "slack")
        await svc.wait(dave, cc.WaitFor(NODE, (GPU,)), "slack")


async def cli_release(config: Path) -> None:
    """``gpubot claim release node2 gpu 3 --as U0BOB``, a real process."""
    done = await asyncio.to_thread(
        gpubot_cli, config, "claim", "release", NODE, "gpu", str(GPU), "--as", "U0BOB"
    )
    assert done.returncode == 0, done.stderr
    assert "released" in done.stdout


def hold_dms(fake: FakeSlack) -> list[Call]:
    return [
        c
        for c in fake.ok("chat.postMessage")
        if c.body.get("channel") == "D0DAVE" and "held for you" in str(c.body.get("text"))
    ]


async def dave_holds(store: Store) -> bool:
    (w,) = await store.claims.waits(NODE)
    return w.state is WaitState.OFFERED and w.offered == (GPU,)


async def test_a_cli_release_while_the_bot_runs_tells_the_waiter_once(
    config: Path, dm_slack: DmSlack
) -> None:
    await queue_behind_bob(config, dm_slack)
    async with bot_running(config, dm_slack) as app:
        await asyncio.sleep(0.5)  # the duty's first tick: dave waits, GPU 3 claimed
        await cli_release(config)
        assert app.store is not None and await dave_holds(app.store)  # the CLI recorded it
        await until(lambda: len(hold_dms(dm_slack)) >= 1, 3 * EVERY_S, "the hold's DM")
        await asyncio.sleep(2 * EVERY_S)  # two more ticks: nothing more
        (dm,) = hold_dms(dm_slack)
        assert f"{NODE} GPU {GPU}" in str(dm.body["text"])


async def test_control_a_hold_recorded_with_no_bot_running_is_told_when_it_runs(
    config: Path, dm_slack: DmSlack
) -> None:
    await queue_behind_bob(config, dm_slack)
    await cli_release(config)  # no bot: the hold is recorded, nobody is told
    assert dm_slack.ok("chat.postMessage") == []
    async with bot_running(config, dm_slack) as app:
        assert app.store is not None and await dave_holds(app.store)
        await until(lambda: len(hold_dms(dm_slack)) >= 1, 3 * EVERY_S, "the hold's DM")
        await asyncio.sleep(EVERY_S + 1)  # another tick: nothing more
    async with bot_running(config, dm_slack):  # a restart: told already, not again
        await asyncio.sleep(1)
    assert len(hold_dms(dm_slack)) == 1
