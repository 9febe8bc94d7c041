"""Alerts that scale (issue 25): 60 nodes, 20 of them dead and a hidden holder on 15 others.

The alert keeper as ``gpubot serve`` composes it (``SlackAlerts`` over the Web API), with the
memory store and the findings of two sweeps made here rather than by 60 simulated nodes (too
slow on a 2-core box): each finding kind is one message, counted at the fake Slack Web API.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpubot.chat.alert_digest import render_alert
from gpubot.core.alerting import AlertGroup, MessageRef, SweepResult
from gpubot.core.findings import (
    GPU_LOST,
    HIDDEN_HOLDER,
    NODE_UNREACHABLE,
    ORPHANED_VRAM,
    ZOMBIE_PROCESS,
    Finding,
    NodeFailure,
    SweepConfig,
)
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.services.alert_keeper import AlertKeeper, ReadinessMap
from gpubot.services.outbox import Outbox
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.render import to_slack
from gpubot.store import Store, open_store
from tests.fixtures.slack import BOT_TOKEN, FakeSlack, assert_within_limits

CHANNEL = "C0ALERTS"
NODES = [f"node{i}" for i in range(1, 61)]
DEAD = NODES[:20]
HIDDEN = NODES[20:35]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


def snap(node: str) -> NodeSnapshot:
    return NodeSnapshot(node, T0.timestamp(), (GpuInfo(0, "GPU-0", "NVIDIA H100", 0, 81559, 0),))


def sweep(dead: list[str], hidden: list[str]) -> SweepResult:
    failed = {n: NodeFailure(NODE_UNREACHABLE, "connection refused") for n in dead}
    findings = [Finding(n, None, f.kind, "", f.reason) for n, f in failed.items()]
    findings += [
        Finding(n, 0, HIDDEN_HOLDER, "4242:77", "pid 4242 python holds GPU 0") for n in hidden
    ]
    snaps = tuple(snap(n) for n in NODES if n not in dead)
    return SweepResult(T0.timestamp(), 1.0, tuple(NODES), snaps, failed, (), tuple(findings))


async def no_readiness(findings: object) -> ReadinessMap:
    return {}


def channel_posts(fake: FakeSlack) -> list[dict[str, Any]]:
    """The messages posted to the channel itself (not in a thread), as sent."""
    return [c.body for c in fake.of("chat.postMessage") if "thread_ts" not in c.body]


def posted_at(fake: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    """(ts, body) of every channel post Slack answered."""
    return [(str(c.answer["ts"]), c.body) for c in fake.ok("chat.postMessage")]


def blocks_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = body["blocks"]
    return list(json.loads(blocks) if isinstance(blocks, str) else blocks)


def button_values(bodies: list[dict[str, Any]]) -> list[str]:
    """The values of every button in ``bodies``' actions blocks."""
    return [
        str(e["value"])
        for body in bodies
        for b in blocks_of(body)
        if b["type"] == "actions"
        for e in b["elements"]
    ]


def thread_replies(fake: FakeSlack, ts: str) -> list[dict[str, Any]]:
    """The replies posted in the thread of message ``ts``."""
    return [c.body for c in fake.of("chat.postMessage") if c.body.get("thread_ts") == ts]


async def test_a_rack_outage_is_one_message_per_kind(store: Store, fake_slack: FakeSlack) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier, Outbox(store.outbox)
    )
    at = T0
    first = await keeper.update(sweep(DEAD, HIDDEN), no_readiness, now=at)
    assert first.alerted == () and fake_slack.of("chat.postMessage") == []  # seen once
    at += timedelta(minutes=5)
    second = await keeper.update(sweep(DEAD, HIDDEN), no_readiness, now=at)
    assert len(second.alerted) == 35
    posts = channel_posts(fake_slack)
    assert len(posts) == 2, [p.get("text") for p in posts]  # one per finding kind, not 35
    texts = sorted(str(p["text"]) for p in posts)
    assert texts[0].startswith("⚠ hidden GPU holder on 15 nodes: 15 findings")
    assert texts[1].startswith("⚠ node unreachable on 20 nodes: 20 findings")
    assert "node35 GPU 0 hidden GPU holder" in texts[0] and "node20 node unreachable" in texts[1]
    for p in posts:  # the channel message stays short: no per-node sections, no buttons
        blocks = json.loads(p["blocks"]) if isinstance(p["blocks"], str) else p["blocks"]
        assert len(blocks) <= 6 and all(b["type"] != "actions" for b in blocks), blocks
    for digest, nodes in ((texts[0], HIDDEN), (texts[1], DEAD)):
        (ts,) = [where for where, p in posted_at(fake_slack) if p["text"] == digest]
        replies = thread_replies(fake_slack, ts)
        assert len(replies) == 1  # batched: one reply, not one per node
        keys = {f.key.text() for f in sweep(DEAD, HIDDEN).findings if f.node in nodes}
        assert len(keys) == len(nodes) and keys <= set(button_values(replies))  # their snoozes

    at += timedelta(minutes=5)  # the rack comes back: held one sweep, then the digest updates
    assert (await keeper.update(sweep([], HIDDEN), no_readiness, now=at)).resolved == ()
    at += timedelta(minutes=5)
    back = await keeper.update(sweep([], HIDDEN), no_readiness, now=at)
    assert len(back.resolved) == 20
    (update,) = [c.body for c in fake_slack.ok("chat.update")]  # the one digest, once
    assert str(update["text"]).startswith("✅ node unreachable on 20 nodes: resolved")
    assert len(channel_posts(fake_slack)) == 2  # nothing new posted
    assert len(fake_slack.of("chat.postMessage")) == 4  # and no reply: the two digests' details
    assert_within_limits(fake_slack)


async def test_the_control_one_node_keeps_its_own_message(
    store: Store, fake_slack: FakeSlack
) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier, Outbox(store.outbox)
    )
    await keeper.update(sweep(["node1"], ["node2"]), no_readiness, now=T0)
    later = T0 + timedelta(minutes=5)
    await keeper.update(sweep(["node1"], ["node2"]), no_readiness, now=later)
    texts = sorted(str(c.body["text"]) for c in fake_slack.of("chat.postMessage"))
    assert [t.split(":", 1)[0] for t in texts] == ["⚠ node1", "⚠ node2"]


async def test_posts_stay_within_one_per_second_per_channel(
    store: Store, fake_slack: FakeSlack
) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier, Outbox(store.outbox)
    )
    kinds = [ORPHANED_VRAM, ZOMBIE_PROCESS, HIDDEN_HOLDER]
    findings = (  # four messages: three digests and node40's own
        *(Finding(n, 0, k, "", "trouble") for k in kinds for n in NODES[:2]),
        Finding("node40", 1, GPU_LOST, "", "lost"),
    )
    result = SweepResult(T0.timestamp(), 1.0, tuple(NODES), findings=findings)
    await keeper.update(result, no_readiness, now=T0)
    await keeper.update(result, no_readiness, now=T0 + timedelta(minutes=5))
    posts = fake_slack.of("chat.postMessage")
    assert len(channel_posts(fake_slack)) == 4 and len(posts) == 7  # + the digests' details
    times = sorted(c.at for c in posts if c.body["channel"] == CHANNEL)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 7 and min(gaps) >= 1.0, gaps  # within Slack's ~1 per second


def hidden_on(nodes: list[str]) -> SweepResult:
    findings = tuple(
        Finding(n, 0, HIDDEN_HOLDER, "4242:77", "pid 4242 python holds GPU 0") for n in nodes
    )
    return SweepResult(
        T0.timestamp(), 1.0, tuple(NODES), tuple(snap(n) for n in NODES), {}, (), findings
    )


async def test_a_wide_digest_batches_its_details_within_slacks_limits(
    store: Store, fake_slack: FakeSlack
) -> None:
    """60 nodes, each finding with three buttons: the details take three replies of at most 50
    blocks (one per node would be 60 posts, a minute of Slack's pace)."""
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier, Outbox(store.outbox)
    )
    await keeper.update(hidden_on(NODES), no_readiness, now=T0)
    await keeper.update(hidden_on(NODES), no_readiness, now=T0 + timedelta(minutes=5))
    [(ts, digest)] = [(t, p) for t, p in posted_at(fake_slack) if "thread_ts" not in p]
    assert str(digest["text"]).startswith("⚠ hidden GPU holder on 60 nodes: 60 findings")
    replies = thread_replies(fake_slack, ts)
    assert len(replies) == 3
    blocks = [
        json.loads(r["blocks"]) if isinstance(r["blocks"], str) else r["blocks"] for r in replies
    ]
    assert all(len(b) <= 50 for b in blocks)
    said = json.dumps(blocks)
    assert said.count('"gpubot_reset_gpu"') == 60  # each node's own Reset GPU 0 button
    assert said.count("gpubot_snooze_1d") == 60
    heads = [f"hidden GPU holder on 60 nodes: details ({n} of 3): " for n in (1, 2, 3)]
    assert [str(r["text"])[: len(h)] for r, h in zip(replies, heads, strict=True)] == heads
    assert_within_limits(fake_slack)


async def test_a_digest_found_after_a_lost_answer_gets_its_details_once(
    store: Store, fake_slack: FakeSlack
) -> None:
    """Slack answers the digest's post after the client's timeout: the outbox finds it in the
    history and adopts it, and its details follow in its thread, once."""
    api = SlackApi(make_client(BOT_TOKEN, fake_slack.base_url, timeout=1))
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL),
        NODES,
        store.alerts,
        SlackAlerts(api, CHANNEL),
        Outbox(store.outbox),
    )
    await keeper.update(hidden_on(NODES[:3]), no_readiness, now=T0)
    fake_slack.delays["chat.postMessage"] = 3.0
    second = await keeper.update(hidden_on(NODES[:3]), no_readiness, now=T0 + timedelta(minutes=5))
    assert len(second.alerted) == 3  # adopted from the history
    fake_slack.delays.clear()
    await keeper.update(hidden_on(NODES[:3]), no_readiness, now=T0 + timedelta(minutes=10))
    [(ts, _)] = [(t, p) for t, p in posted_at(fake_slack) if "thread_ts" not in p]
    assert len(thread_replies(fake_slack, ts)) == 1
    assert len(channel_posts(fake_slack)) == 1


async def test_digest_updates_are_paced_like_posts(store: Store, fake_slack: FakeSlack) -> None:
    """Three digests resolve in one sweep: three chat.update calls, like every post and reply
    to the channel at least a second apart (counted and timed at the fake Web API)."""
    gaps = await _resolve_three(store, fake_slack)
    assert min(gaps) >= 1.0, gaps


async def test_control_updates_without_pacing_come_at_once(
    store: Store, fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unpaced(self: SlackAlerts, where: MessageRef, group: AlertGroup) -> None:
        await self.api.update(where, to_slack(render_alert(group)))  # the update before pacing

    monkeypatch.setattr(SlackAlerts, "update", unpaced)
    gaps = await _resolve_three(store, fake_slack)
    assert min(gaps) < 1.0, gaps


async def _resolve_three(store: Store, fake: FakeSlack) -> list[float]:
    """Alert three digests, clear them for two sweeps; return the gaps between the updates."""
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake.base_url)), CHANNEL)
    keeper = AlertKeeper(
        SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier, Outbox(store.outbox)
    )
    kinds = [ORPHANED_VRAM, ZOMBIE_PROCESS, HIDDEN_HOLDER]
    findings = tuple(Finding(n, 0, k, "", "trouble") for k in kinds for n in NODES[:2])
    result = SweepResult(T0.timestamp(), 1.0, tuple(NODES), findings=findings)
    snaps = tuple(snap(n) for n in NODES)
    clear = SweepResult(T0.timestamp(), 1.0, tuple(NODES), snaps)
    at = T0
    for r in (result, result, clear, clear):
        await keeper.update(r, no_readiness, now=at)
        at += timedelta(minutes=5)
    updates = fake.ok("chat.update")
    assert len(updates) == 3 and len(channel_posts(fake)) == 3
    assert all(str(u.body["text"]).startswith("✅ ") for u in updates)
    times = sorted(c.at for c in fake.calls if c.body.get("channel") == CHANNEL)
    assert len(times) == 9  # 3 digests, 3 replies, 3 updates: nothing else
    return [b - a for a, b in itertools.pairwise(sorted(u.at for u in updates))]
