"""While the audit database is down, the bot's log says so once, and once when it is back: no
traceback or line on every turn of the approvals' expiry loop (every 30 s in ``gpubot serve``),
which is where the traceback of issue 22 came from. The store says it (``store.outage``), while
the app's lifecycle runs (``App.running``); ``test_db_outage_duties`` has every duty of
``gpubot serve`` and two replicas.

The database is a PostgreSQL of the test's own (``tests.fixtures.own_pg``), stopped and started
under the running bot (the real composition over HTTP, ``running_bot``). The loop turns every
0.2 s here so that one outage spans many turns.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpubot.scheduler import IntervalScheduler
from gpubot.store import outage
from tests.fixtures.own_pg import OwnPostgres, own_postgres
from tests.fixtures.slack import FakeSlack, Harness, running_bot

Bot = tuple[Harness, OwnPostgres]


@pytest.fixture
async def pg_bot(slack_settings: Any, fake_slack: FakeSlack) -> AsyncIterator[Bot]:
    with own_postgres() as pg:
        async with running_bot(slack_settings, fake_slack, pg.url) as h:
            yield h, pg


async def _outage(bot: Bot, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the expiry loop before, during (2 s) and after a stop of the database; return how
    many turns it made while the database was down."""
    h, pg = bot
    turns = {"n": 0, "down": False}
    expire = h.bot.flows.expire

    async def counted(out: Any) -> int:
        turns["n"] += 1 if turns["down"] else 0
        return int(await expire(out))

    monkeypatch.setattr(h.bot.flows, "expire", counted)
    expiry = IntervalScheduler(h.expire, 0.2, first_after_s=0, name="approval-expiry")
    async with h.app.running():
        expiry.start()
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(pg.stop)
            turns["down"] = True
            await asyncio.sleep(2.0)
            turns["down"] = False
            await asyncio.to_thread(pg.start)
            await asyncio.sleep(2.0)
        finally:
            await expiry.stop()
    return turns["n"]


# How the server going away reads depends on the moment it is met: "Connection refused",
# "server closed the connection unexpectedly", "the database system is shutting down" ...; each
# names a connection, and the line must carry the driver's words for it.
# What PostgreSQL and libpq say while a server stops, is down, or starts again.
DOWN = re.compile(
    r"connection (refused|failed|to server)|closed the connection|terminating connection"
    r"|(shutting|starting) (down|up)|could not receive data",
    re.IGNORECASE,
)


def _app_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name in ("gpubot.app.duties", "gpubot.store.outage")]


async def test_one_line_when_the_database_goes_and_one_when_it_is_back(
    pg_bot: Bot, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    down_turns = await _outage(pg_bot, monkeypatch)
    assert down_turns >= 4  # many turns failed while it was down ...
    records = _app_records(caplog)
    messages = [r.getMessage() for r in records]
    assert len(records) == 2, messages  # ... and the log has two lines for them
    gone, back = records
    assert gone.levelno == logging.ERROR
    assert gone.getMessage().startswith("audit database unreachable since 20")
    assert DOWN.search(gone.getMessage()), gone.getMessage()
    assert re.match(
        r"audit database reachable again after \d+ s \(unreachable since 20", back.getMessage()
    )
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert "Traceback" not in caplog.text


async def test_control_without_the_filter_a_line_is_logged_on_every_turn(
    pg_bot: Bot, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defence removed (the log no longer drops what the outage's line said): a line on
    every turn while the database is down."""
    monkeypatch.setattr(outage.SaidOnce, "filter", lambda self, record: True)
    caplog.set_level(logging.INFO)
    down_turns = await _outage(pg_bot, monkeypatch)
    failed = [r for r in _app_records(caplog) if r.getMessage().startswith("approvals not expired")]
    assert len(failed) >= max(4, down_turns - 1)
    assert all(DOWN.search(r.getMessage()) for r in failed)
