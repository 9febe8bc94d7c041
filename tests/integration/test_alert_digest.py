"""Alerts that scale (issue 25): 60 nodes, 20 of them dead and a hidden holder on 15 others.

The alert keeper as ``gpubot serve`` composes it (``SlackAlerts`` over the Web API), with the
memory store and the findings of two sweeps made here rather than by 60 simulated nodes (too
slow on a 2-core box): each finding kind is one message, counted at the fake Slack Web API.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from gpubot.core.alerting import SweepResult
from gpubot.core.findings import Finding, NodeFailure, SweepConfig
from gpubot.core.models import FindingKind, GpuInfo, NodeSnapshot
from gpubot.services.alert_keeper import AlertKeeper, ReadinessMap
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
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
    failed = {n: NodeFailure(FindingKind.NODE_UNREACHABLE, "connection refused") for n in dead}
    findings = [Finding(n, None, f.kind, "", f.reason) for n, f in failed.items()]
    findings += [
        Finding(n, 0, FindingKind.HIDDEN_HOLDER, "4242:77", "pid 4242 python holds GPU 0")
        for n in hidden
    ]
    snaps = tuple(snap(n) for n in NODES if n not in dead)
    return SweepResult(T0.timestamp(), 1.0, tuple(NODES), snaps, failed, (), tuple(findings))


async def no_readiness(findings: object) -> ReadinessMap:
    return {}


async def test_a_rack_outage_is_one_message_per_kind(store: Store, fake_slack: FakeSlack) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier)
    at = T0
    first = await keeper.update(sweep(DEAD, HIDDEN), no_readiness, now=at)
    assert first.alerted == () and fake_slack.of("chat.postMessage") == []  # seen once
    at += timedelta(minutes=5)
    second = await keeper.update(sweep(DEAD, HIDDEN), no_readiness, now=at)
    assert len(second.alerted) == 35
    posts = [c.body for c in fake_slack.of("chat.postMessage")]
    assert len(posts) == 2, [p.get("text") for p in posts]  # one per finding kind, not 35
    texts = sorted(str(p["text"]) for p in posts)
    assert texts[0].startswith("⚠ hidden GPU holder on 15 nodes: 15 findings")
    assert texts[1].startswith("⚠ node unreachable on 20 nodes: 20 findings")
    assert "node35 GPU 0 hidden GPU holder" in texts[0] and "node20 node unreachable" in texts[1]

    at += timedelta(minutes=5)  # the rack comes back: held one sweep, then the digest updates
    assert (await keeper.update(sweep([], HIDDEN), no_readiness, now=at)).resolved == ()
    at += timedelta(minutes=5)
    back = await keeper.update(sweep([], HIDDEN), no_readiness, now=at)
    assert len(back.resolved) == 20
    (update,) = [c.body for c in fake_slack.ok("chat.update")]  # the one digest, once
    assert str(update["text"]).startswith("✅ node unreachable on 20 nodes: resolved")
    assert len(fake_slack.of("chat.postMessage")) == 2  # nothing new posted
    assert_within_limits(fake_slack)


async def test_the_control_one_node_keeps_its_own_message(
    store: Store, fake_slack: FakeSlack
) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier)
    await keeper.update(sweep(["node1"], ["node2"]), no_readiness, now=T0)
    later = T0 + timedelta(minutes=5)
    await keeper.update(sweep(["node1"], ["node2"]), no_readiness, now=later)
    texts = sorted(str(c.body["text"]) for c in fake_slack.of("chat.postMessage"))
    assert [t.split(":", 1)[0] for t in texts] == ["⚠ node1", "⚠ node2"]


async def test_posts_stay_within_one_per_second_per_channel(
    store: Store, fake_slack: FakeSlack
) -> None:
    notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake_slack.base_url)), CHANNEL)
    keeper = AlertKeeper(SweepConfig(channel=CHANNEL), NODES, store.alerts, notifier)
    kinds = [FindingKind.ORPHANED_VRAM, FindingKind.ZOMBIE_PROCESS, FindingKind.HIDDEN_HOLDER]
    findings = (  # four messages: three digests and node40's own
        *(Finding(n, 0, k, "", "trouble") for k in kinds for n in NODES[:2]),
        Finding("node40", 1, FindingKind.GPU_LOST, "", "lost"),
    )
    result = SweepResult(T0.timestamp(), 1.0, tuple(NODES), findings=findings)
    await keeper.update(result, no_readiness, now=T0)
    await keeper.update(result, no_readiness, now=T0 + timedelta(minutes=5))
    posts = fake_slack.of("chat.postMessage")
    assert len(posts) == 4
    times = sorted(c.at for c in posts if c.body["channel"] == CHANNEL)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 4 and min(gaps) >= 1.0, gaps  # within Slack's ~1 per second
