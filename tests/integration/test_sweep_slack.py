"""Sweeps as ``gpubot serve`` wires them (``gpubot.app.build(serving=...)``), inside the real
bot over HTTP: the scheduled sweep, the alert message, its snooze buttons clicked through signed
requests, ``/gpu sweep``, and the metrics endpoint scraped
on 127.0.0.1 (GPU gauges, open findings, sweep durations, node failures, resets by outcome)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpubot.app import App, Serving, build
from gpubot.chat import alerts
from gpubot.config import AuditSettings
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.findings import HIDDEN_HOLDER, ORPHANED_VRAM, Finding
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.readiness import Readiness
from gpubot.errors import ConfigError
from gpubot.metrics import Metrics
from gpubot.slack.blockkit import limit_problems, message_text
from gpubot.slack.serve import start_http
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.settings import with_sweep
from tests.fixtures.slack import (
    SECRET,
    FakeSlack,
    Harness,
    SlackSender,
    assert_within_limits,
    owned,
    slack_bot,
    slack_front,
)
from tests.fixtures.slack_render import view
from tests.procs import wait_dead

render_alert_group = view(alerts.render_alert_group)
render_reminder = view(alerts.render_reminder)

MIB = 1024 * 1024
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("postgresql", tmp_path) as url:
        yield url


@asynccontextmanager
async def serving(
    settings: Any, fake: FakeSlack, db_url: str
) -> AsyncIterator[tuple[Harness, App, int | None]]:
    """What ``gpubot serve`` does: the app with its schedules, the bot, the metrics (the audit
    head's publication, which posts to the same channel at start, has its own test)."""
    settings = dataclasses.replace(settings, database_url=db_url, audit=AuditSettings(None))
    settings = with_sweep(settings, interval_s=3600)  # one scheduled sweep, at once
    front = slack_front(fake, min_update_s=0.05)
    options = Serving(metrics_port=0, settle_heap=False, first_after_s=0)
    app = build(settings, {}, need_store=True, front=front, serving=options)
    bot = slack_bot(app, front)
    runner = await start_http(bot, "127.0.0.1", 0, "/slack/events")
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    try:
        async with app.running() as run:
            harness = Harness(bot, fake, SlackSender(url, SECRET, fake), app.store, url, app)
            yield harness, app, run.metrics_port
    finally:
        await bot.drain()
        await runner.cleanup()
        await app.close()


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def kill_and_wait(pid: int) -> None:
    os.kill(pid, 9)
    wait_dead(pid)


async def test_sweeps_in_the_bot(
    slack_fleet: SimFleet, slack_settings: Any, fake_slack: FakeSlack, pg_url: str
) -> None:
    n1 = slack_fleet.node("node1")
    w = n1.spawn(gpu=3, mib=4096, behaviour="orphan")
    kill_and_wait(w.pid)
    mine = owned(slack_fleet, "node2").spawn(gpu=0, mib=1000)  # U0OWNER's
    try:
        async with serving(slack_settings, fake_slack, pg_url) as (h, app, metrics_port):
            store = h.store
            # the scheduler's first sweep runs at once and records itself
            deadline = time.monotonic() + 20
            while not [r for r in await store.queries() if r.source == "schedule"]:
                assert time.monotonic() < deadline, "no scheduled sweep"
                await asyncio.sleep(0.05)
            assert fake_slack.of("chat.postMessage") == []  # seen once: no alert yet
            second = await app.sweep.run()  # the next interval's sweep
            assert len(second.alerted) == 1
            (posted,) = fake_slack.ok("chat.postMessage")
            channel, ts = posted.answer["channel"], posted.answer["ts"]
            assert channel == "C0GENERAL"  # [slack] channel: no [alerts] channel set
            blocks = posted.body["blocks"]
            blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
            buttons = {
                e["action_id"]: e["value"]
                for b in blocks
                if b["type"] == "actions"
                for e in b["elements"]
            }
            assert buttons["gpubot_reset_gpu"] == "node1:3"

            # "Snooze 1 day", clicked in Slack
            reply = await h.send.click(
                "gpubot_snooze_1d", buttons["gpubot_snooze_1d"], channel=channel, message_ts=ts
            )
            assert reply.status == 200 and reply.seconds < 3
            await h.settle()
            (alert,) = await store.alerts.open_alerts()
            assert alert.snoozed_until is not None
            left = alert.snoozed_until.timestamp() - time.time()
            assert 86400 - 60 < left <= 86400
            (update,) = fake_slack.ok("chat.update")
            assert (update.body["channel"], update.body["ts"]) == (channel, ts)
            assert "snoozed until" in json.dumps(update.body["blocks"])
            answers = [c.body for c in fake_slack.calls if c.method.startswith("response:")]
            assert answers and "snoozed until" in answers[-1]["text"]
            assert answers[-1]["response_type"] == "ephemeral"
            records = [r for r in await store.records() if r.kind == "alert"]
            assert [(r.data["alert"], r.actor) for r in records] == [
                ("alerted", "gpubot"),
                ("snoozed", "slack:U0CAROL"),
            ]

            # a forged button value is refused, to the clicker only
            await h.send.click("gpubot_snooze_1h", "not-a-key", channel=channel, message_ts=ts)
            await h.settle()
            answers = [c.body for c in fake_slack.calls if c.method.startswith("response:")]
            assert "not a finding key" in answers[-1]["text"]

            # /gpu sweep: a read-only sweep now, answered where it was asked
            reply = await h.send.command("sweep", user="U0BOB")
            assert reply.status == 200
            await h.settle()
            last = fake_slack.ok("chat.update")[-1].body
            assert "Sweep: 2 node(s), 0 failing, 1 finding(s)" in last["text"]
            assert "node1 GPU 3: orphaned-vram" in json.dumps(last["blocks"])
            assert len(fake_slack.ok("chat.postMessage")) == 2  # the alert, and "sweeping …"

            # a reset through Slack is counted by outcome
            reply = await h.send.command("reset node2 gpu 0", user="U0OWNER")
            await h.settle()
            assert not mine.alive()

            m = scrape(metrics_port or 0)
            uuid = second.snapshots[0].gpus[3].uuid
            assert (
                value(m, "gpubot_gpu_memory_used_bytes", node="node1", gpu="3", uuid=uuid)
                == 4096 * MIB
            )
            total = value(m, "gpubot_gpu_memory_total_bytes", node="node1", gpu="3", uuid=uuid)
            assert total == slack_fleet.memory_mib * MIB
            assert value(m, "gpubot_gpu_utilization_ratio", node="node1", gpu="3", uuid=uuid) == 0.0
            assert value(m, "gpubot_findings_open", kind="orphaned-vram") == 1.0
            assert value(m, "gpubot_findings_open", kind="zombie-process") == 0.0
            assert value(m, "gpubot_sweep_duration_seconds_count") == 3.0
            assert value(m, "gpubot_resets_total", outcome="freed") == 1.0
    finally:
        n1.clear()
        slack_fleet.node("node2").clear()
    assert_within_limits(fake_slack)


def test_metrics_of_a_sweep_with_a_failing_node() -> None:
    m = Metrics()
    gpus = (
        GpuInfo(0, "GPU-a", "H200", 1024, 143771, 37),
        GpuInfo(1, "GPU-b", "H200", None, None, None),
    )
    m.observe_sweep([NodeSnapshot("n1", 0.0, gpus)], ["n2"], 1.5, {"hidden-holder": 2})
    m.observe_sweep([NodeSnapshot("n1", 0.0, gpus[:1])], ["n2", "n3"], 0.5, {})
    port = m.serve(0)
    try:
        s = scrape(port)
        with pytest.raises(ConfigError, match="served already"):
            m.serve(0)
        taken = Metrics()
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            taken.serve(port)
    finally:
        m.close()
    assert value(s, "gpubot_gpu_memory_used_bytes", node="n1", gpu="0", uuid="GPU-a") == 1024 * MIB
    assert value(s, "gpubot_gpu_utilization_ratio", node="n1", gpu="0", uuid="GPU-a") == 0.37
    # unknown values and GPUs the last sweep did not see have no series at all
    assert not [k for k in s if ("gpu", "1") in k[1]]
    assert value(s, "gpubot_findings_open", kind="hidden-holder") == 0.0  # the last sweep's
    assert value(s, "gpubot_node_failures_total", node="n2") == 2.0
    assert value(s, "gpubot_node_failures_total", node="n3") == 1.0
    assert value(s, "gpubot_sweep_duration_seconds_count") == 2.0
    assert value(s, "gpubot_sweep_duration_seconds_sum") == 2.0
    assert "gpubot_gpu_memory_used_bytes" in m.text()


def test_a_crowded_alert_fits_slack() -> None:
    """64 GPUs with a finding each, long names and readiness lists: within every limit."""
    now = datetime.now(UTC)
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "H200", 9000, 143771, 0) for i in range(64))
    procs = tuple(
        GpuProcess(
            10_000 + i, i, 9000, "x" * 300, False, True, user="<!channel>", command="y" * 500
        )
        for i in range(64)
    )
    items = []
    for i in range(64):
        kind = HIDDEN_HOLDER if i % 2 else ORPHANED_VRAM
        f = Finding("node1", i, kind, f"{10_000 + i}:1" if i % 2 else "", "z<@U0>&" * 200)
        ready = Readiness(i, ("p" * 400,) * 8, "running (pid 1)", tuple(range(64)), "", None, None)
        resolved = now if i % 5 == 0 else None
        items.append(
            AlertItem(f.key, f, now - timedelta(hours=3), resolved, now + timedelta(hours=1), ready)
        )
    group = AlertGroup("node1", tuple(items), NodeSnapshot("node1", 0.0, gpus, procs), now)
    for msg in (render_alert_group(group), render_reminder(group)):
        assert limit_problems(msg) == [], limit_problems(msg)
        # mrkdwn (and the notification text) is escaped; table cells are raw text by type
        mrkdwn = [msg["text"]] + [
            t["text"]
            for b in msg["blocks"]
            for t in ([b["text"]] if "text" in b else []) + b.get("elements", [])
            if t.get("type") == "mrkdwn" or b["type"] == "header"
        ]
        assert not [t for t in mrkdwn if "<!channel>" in t or "<@U0>" in t]
    assert "z&lt;@U0&gt;&amp;" in json.dumps(render_alert_group(group))
    text = message_text(render_alert_group(group))
    assert "51 of 64 findings open" in text and "more finding(s) on node1" in text
    assert "resolved* after 3 h" not in text and "resolved after 3 h" in text
    assert "snoozed until" in text
