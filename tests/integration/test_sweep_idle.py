"""Idle hoarders on the simulated fleet, over hours of a clock the test moves.

The bot runs as ``gpubot serve`` wires it (HTTP, a fresh SQLite database, the fake Web API);
its sweep service gets the test's clock, so an hour of sweeps every 15 minutes takes seconds.
Everything else is real: SSH, workload processes at 0 % or busy, signals, the CLI as a process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, build
from gpubot.chat.idle import ACTION_FREE
from gpubot.core.alerting import SweepResult
from gpubot.core.findings import IDLE_HOLDER
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.serve import start_http
from gpusim.fleet import SimFleet
from tests.fixtures.settings import ManualClock, with_sweep
from tests.fixtures.slack import (
    BOT_TOKEN,
    SECRET,
    Call,
    DmSlack,
    FakeSlack,
    Harness,
    SlackSender,
    assert_within_limits,
    owned,
    slack_bot,
    slack_front,
    workload_owner,
)
from tests.fixtures.slack_flows import idle_group

INTERVAL = 900  # a sweep every 15 minutes of the test's clock
SWEEP = {"interval_s": INTERVAL, "idle_hours": 1, "idle_min_mib": 4096, "keep_samples": "1d"}


@pytest.fixture
def node1(slack_fleet: SimFleet) -> Iterator[Any]:
    from tests.fixtures.fleet import leave_clean

    yield owned(slack_fleet, "node1")
    leave_clean(slack_fleet.node("node1"))


@asynccontextmanager
async def serving(
    settings: Any, fake: FakeSlack, db_url: str, clock: ManualClock
) -> AsyncIterator[tuple[Harness, App]]:
    """The bot as ``gpubot serve`` wires it, with no schedule: the test sweeps on its clock."""
    settings = with_sweep(dataclasses.replace(settings, database_url=db_url), **SWEEP)
    front = slack_front(fake, min_update_s=0.05)
    app = build(settings, {}, need_store=True, front=front)
    app.sweep.clock = clock
    assert app.sweep.keeper is not None and app.sweep.idle is not None
    app.sweep.keeper.clock = app.sweep.idle.clock = clock
    bot = slack_bot(app, front)
    runner = await start_http(bot, "127.0.0.1", 0, "/slack/events")
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    try:
        yield Harness(bot, fake, SlackSender(url, SECRET, fake), app.store, url, app), app
    finally:
        await bot.drain()
        await runner.cleanup()
        await app.close()


def idle_keys(result: SweepResult) -> set[tuple[str, int | None, str]]:
    return {(f.node, f.gpu, f.holder) for f in result.findings if f.kind is IDLE_HOLDER}


def blocks_of(call: Call) -> list[dict[str, Any]]:
    b = call.body.get("blocks") or []
    return json.loads(b) if isinstance(b, str) else list(b)


def buttons(call: Call) -> list[tuple[str, str, str]]:
    return [
        (e["text"]["text"], e["action_id"], e["value"])
        for b in blocks_of(call)
        if b["type"] == "actions"
        for e in b["elements"]
    ]


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


async def test_an_idle_hoarder_is_found_after_the_window_and_told_in_a_dm(
    slack_fleet: SimFleet, slack_settings: Any, dm_slack: DmSlack, node1: Any, tmp_path: Path
) -> None:
    owner = workload_owner(slack_fleet)
    hoarder = node1.spawn(gpu=0, mib=8192, util_pct=0)
    node1.spawn(gpu=1, mib=8192, util_pct=80)  # busy the whole time
    late = node1.spawn(gpu=2, mib=8192, util_pct=0)  # idle, but its GPU was busy at first ...
    helper = node1.spawn(gpu=2, mib=512, util_pct=30)  # ... while this one ran
    node1.spawn(gpu=3, mib=1024, util_pct=0)  # idle, but holds less than idle_min_mib
    db_url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    # The test's hour of sweeps ends two minutes before the real now: the CLI, on real time,
    # continues the same run of samples.
    start = time.time() - 3600 - 120
    clock = ManualClock(start)
    fake = dm_slack
    async with serving(slack_settings, fake, db_url, clock) as (h, app):
        svc = app.sweep
        for i in range(4):  # 0, 15, 30, 45 minutes: not an hour yet
            clock.t = start + i * INTERVAL
            result = await svc.run()
            assert result.failed == {}
            assert idle_keys(result) == set(), i
            if i == 1:
                os.kill(helper.pid, 9)  # GPU 2 is at 0 % from the next sweep on
        clock.t = start + 4 * INTERVAL  # an hour of samples at 0 % on GPU 0 only
        found = await svc.run()
        assert idle_keys(found) == {("node1", 0, f"{hoarder.pid}:{hoarder.start_ticks}")}
        (f,) = [f for f in found.findings if f.kind is IDLE_HOLDER]
        assert f.owner == owner and f.memory_mib == 8192
        assert f.summary.endswith("holds 8192 MiB of GPU 0, idle (0 %) for 1 h")
        assert found.idle_gpu_hours == {owner: pytest.approx(1.0)}
        assert found.alerted == () and fake.of("chat.postMessage") == []  # seen once: wait
        assert late.alive()

        # `gpubot sweep --json` on real time: the same samples, the same holder runs (kept in
        # the store, issue 34): the CLI is a new process, yet it knows the hoarder has held
        # GPU 0 for the hour, and names it with the figure per owner
        config = tmp_path / "gpubot.toml"
        text = re.sub(
            r'(?m)^url = "sqlite:///.*"$', f'url = "{db_url}"', slack_fleet.config_path.read_text()
        )
        config.write_text(
            text + "\n[sweep]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in SWEEP.items())
        )
        out = cli(config, "sweep", "--json")
        assert out.returncode == 1, out.stderr  # 1: something was found
        doc = json.loads(out.stdout)
        idle = [d for d in doc["findings"] if d["kind"] == "idle-holder"]
        assert [(d["node"], d["gpu"], d["pid"], d["owner"]) for d in idle] == [
            ("node1", 0, hoarder.pid, owner)
        ]
        assert list(doc["idle_gpu_hours"]) == [owner]
        assert 1.0 <= doc["idle_gpu_hours"][owner] < 1.1  # an hour and the last minutes
        out = cli(config, "sweep")
        held = re.search(rf"^GPU-hours held idle: {re.escape(owner)} (\d+\.\d)$", out.stdout, re.M)
        assert held is not None and held[1] in ("1.0", "1.1"), out.stdout

        # the next sweep confirms it: the channel alert, then the owner's DM
        clock.t = start + 5 * INTERVAL
        alerted = await svc.run()
        assert [tuple(k) for k in alerted.alerted] == [
            ("node1", 0, "idle-holder", f"{hoarder.pid}:{hoarder.start_ticks}")
        ]
        posts = fake.ok("chat.postMessage")
        assert [p.body["channel"] for p in posts] == ["C0GENERAL", "D0OWNER"]
        assert [c.body["users"] for c in fake.of("conversations.open")] == ["U0OWNER"]
        dm = posts[1]
        said = json.dumps(blocks_of(dm), ensure_ascii=False)
        assert dm.body["text"] == "Your job holds node1 GPU 0 idle (1 h 15 min at 0 %)"
        assert f"pid {hoarder.pid} python3 ({hoarder.user}) holds 8192 MiB of GPU 0" in said
        assert f"owner: `{owner}`" in said and "Free it" in said
        key = alerted.alerted[0].text()
        assert buttons(dm) == [
            ("Free it", ACTION_FREE, key),
            ("Snooze 1 day", "gpubot_snooze_1d", key),
        ]
        assert "idle GPU holder" in json.dumps(blocks_of(posts[0]))

        clock.t = start + 6 * INTERVAL  # GPU 0 persists: no second DM; GPU 2 has now been at
        later = await svc.run()  # 0 % for an hour since its last busy sample: seen once
        assert idle_keys(later) == {
            ("node1", 0, f"{hoarder.pid}:{hoarder.start_ticks}"),
            ("node1", 2, f"{late.pid}:{late.start_ticks}"),
        }
        assert later.alerted == () and len(fake.ok("chat.postMessage")) == 2
        assert later.idle_gpu_hours == {owner: pytest.approx(2.5)}  # 1.5 h + 1 h

        # the Home tab says how many GPU-hours the owner holds idle
        await h.send.event({"type": "app_home_opened", "user": "U0OWNER", "tab": "home"})
        await h.settle()
        (view,) = [c.body["view"] for c in fake.ok("views.publish")]
        view = json.loads(view) if isinstance(view, str) else view
        home = json.dumps(view["blocks"], ensure_ascii=False)
        assert "You hold GPUs idle: 2.5 GPU-hours so far" in home, home
        assert f"GPU-hours held idle: {owner} 2.5" in home

        # "Free it", clicked in the DM: the owner's own reset of that pid, at once
        reply = await h.send.click(
            ACTION_FREE, key, user="U0OWNER", channel="D0OWNER", message_ts=str(dm.answer["ts"])
        )
        assert reply.status == 200 and reply.seconds < 3
        await h.settle()
        assert not hoarder.alive() and late.alive()
        done = [c for c in fake.ok("chat.update") if c.body["channel"] == "D0OWNER"][-1]
        assert "freed" in done.body["text"]
        (action,) = await h.store.actions()
        assert (action.actor, action.status) == ("U0OWNER", "freed")
        assert action.command == f"/gpu reset node1 gpu 0 pid {hoarder.pid} (Free it)"

        # a second click finds nothing to free: the process is gone, nothing else is touched
        await h.send.click(
            ACTION_FREE, key, user="U0OWNER", channel="D0OWNER", message_ts=str(dm.answer["ts"])
        )
        await h.settle()
        answers = [c.body.get("text", "") for c in fake.responses()]
        assert f"pid {hoarder.pid} no longer holds node1 GPU 0" in answers[-1]
        assert len(await h.store.actions()) == 1
    assert_within_limits(fake)


# --- the DM alone --------------------------------------------------------------------------------

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_a_dm_that_cannot_be_sent_changes_nothing_else(
    dm_slack: DmSlack, caplog: pytest.LogCaptureFixture
) -> None:
    api = SlackApi(make_client(BOT_TOKEN, dm_slack.base_url))
    alerts = SlackAlerts(api, "C0ALERTS", people={"alice": ("U0ALICE",)})
    dm_slack.fail("conversations.open", "missing_scope")  # the app lacks im:write
    with caplog.at_level(logging.WARNING):
        where = (await alerts.post(idle_group("alice"), token="t1")).ref
    assert where is not None and where.startswith("C0ALERTS/")  # the alert stands: alerted
    assert [c.body["channel"] for c in dm_slack.ok("chat.postMessage")] == ["C0ALERTS"]
    assert any(
        "conversations.open with U0ALICE failed: missing_scope (add the im:write scope"
        in r.getMessage()
        for r in caplog.records
    )

    dm_slack.fail("chat.postMessage", "cannot_dm_bot", channel="D0ALICE")  # the DM is refused
    assert (await alerts.post(idle_group("alice"), token="t2")).ref is not None
    assert [c.body["channel"] for c in dm_slack.of("chat.postMessage")] == [
        "C0ALERTS",
        "C0ALERTS",
        "D0ALICE",
    ]

    assert await alerts.direct(idle_group("bob"), None) == 0  # bob maps to nobody in Slack
    assert await alerts.direct(idle_group("alice"), None) == 1
    assert len(dm_slack.of("conversations.open")) == 2  # the DM channel is remembered
    assert_within_limits(dm_slack)
