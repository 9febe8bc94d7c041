"""The weekly GPU-hours digest, posted once a week through the one outbox, over the fake Web API.

Real parts: the SQLite store (``DbOutbox``, ``DbUsage``), the Slack poster (``post_once``,
``find_post``) on the loopback fake. The clock is the test's: Monday 09:00 is reached in a
few calls. A bot that dies between the post and its record is played by posting with the
recorded token and never recording the end: the next run finds it by its token and posts no
second digest; with the channel's history unreadable it posts none either (at most once).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubot.chat.report_view import ChannelDigest
from gpubot.config import Settings
from gpubot.core.alerting import Intent
from gpubot.core.findings import SweepConfig
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.report import Digest, Window
from gpubot.services.digest import DigestService
from gpubot.services.outbox import SETTLE_S, Outbox
from gpubot.services.usage import UsageService
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.poster import EVENT, SlackPoster
from gpubot.store import open_store
from tests.fixtures.settings import ManualClock
from tests.fixtures.slack import BOT_TOKEN, FakeSlack

WEEK = 7 * 86400.0
# A Monday 09:00 UTC two weeks back: both weeks' posts are then older than Slack's own
# message times (now), as they are for a bot on a real clock.
MONDAY_9 = Digest.parse("mon 09:00").last_due(time.time()) - 2 * WEEK


def day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    f = FakeSlack()
    await f.start()
    yield f
    await f.stop()


def digests(fake: FakeSlack) -> list[dict[str, object]]:
    out = []
    for c in fake.ok("chat.postMessage"):
        meta = c.body.get("metadata")
        meta = json.loads(meta) if isinstance(meta, str) else meta
        if isinstance(meta, dict) and meta.get("event_type") == EVENT:
            out.append(c.body)
    return out


async def test_the_digest_is_posted_once_a_week(fake: FakeSlack, tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'gpubot.db'}")
    api = SlackApi(make_client(BOT_TOKEN, fake.base_url))
    clock = ManualClock(MONDAY_9 - 86400)
    try:
        usage = UsageService(Settings(sweep=SweepConfig(interval_s=900.0)), store.usage)
        usage.clock = clock
        proc = GpuProcess(4242, 0, 8192, "python3", True, True, user="alice", start_ticks=1)
        for i in range(8):  # two hours of alice's busy GPU, the Sunday before
            at = MONDAY_9 - 86400 + i * 900.0
            gpu = GpuInfo(0, "GPU-0", "H200", 8192, 143771, 50)
            await usage.record([NodeSnapshot("n1", at, (gpu,), (proc,))], at)
        outbox = Outbox(store.outbox, SlackPoster(api))
        told = ChannelDigest(outbox, "C0GENERAL")
        svc = DigestService(Digest.parse("mon 09:00"), "user", usage, outbox, told, clock=clock)
        assert await svc.run_due() is None  # Sunday: last week's was more than a day ago
        clock.t = MONDAY_9 - 60
        assert await svc.run_due() is None and digests(fake) == []
        clock.t = MONDAY_9 + 300
        assert await svc.run_due() == f"digest:{day(MONDAY_9)}"
        (posted,) = digests(fake)
        assert "Weekly GPU-hours by user" in str(posted["text"])
        said = json.dumps(posted, ensure_ascii=False)
        window = f"{day(MONDAY_9 - WEEK)} 09:00 to {day(MONDAY_9)} 09:00 UTC"
        assert "alice" in said and f"8 sweep(s) in {window}" in said
        clock.t = MONDAY_9 + 600
        assert await svc.run_due() is None and len(digests(fake)) == 1  # once

        # next week: the bot dies after Slack took the post, before it was recorded
        clock.t = MONDAY_9 + WEEK + 120
        period = f"digest:{day(MONDAY_9 + WEEK)}"
        crash = Intent(period, datetime.fromtimestamp(clock.t, UTC), once=True, token="tok-crash")
        assert await store.outbox.begin(crash)
        report = await usage.report_of(Window(int(MONDAY_9), int(MONDAY_9 + WEEK)), "user", clock.t)
        await told.post(report, token="tok-crash")
        assert len(digests(fake)) == 2
        # Within a minute of its start the post may still be on its way: left alone.
        assert await svc.run_due() is None and fake.of("conversations.history") == []
        clock.t += SETTLE_S + 1
        fake.history_readable = False  # cannot tell: never a second digest on a guess
        assert await svc.run_due() is None and len(digests(fake)) == 2
        fake.history_readable = True
        clock.t += SETTLE_S + 1  # that look took the post: the next one waits as long
        assert await svc.run_due() == period  # found by its token, adopted
        assert len(digests(fake)) == 2
        assert await store.outbox.pending(period) == [] and await store.outbox.recorded(period)
        clock.t += 900
        assert await svc.run_due() is None and len(digests(fake)) == 2
    finally:
        await api.close()
        store.close()
