"""A digest's channel message stays short whatever the fleet; its details go to its thread."""

from __future__ import annotations

from datetime import UTC, datetime

from gpubot.chat.alert_digest import is_digest, render_alert, render_digest_details
from gpubot.chat.alerts import render_alert_group
from gpubot.chat.message import Actions, Section
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.findings import HIDDEN_HOLDER, FindingKey
from gpubot.slack.render import to_slack

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def group(nodes: list[str], resolved: int = 0) -> AlertGroup:
    keys = [FindingKey(n, 0, HIDDEN_HOLDER.value, "1:2") for n in nodes]
    items = tuple(AlertItem(k, None, AT, AT if i < resolved else None) for i, k in enumerate(keys))
    return AlertGroup(f"hidden GPU holder on {len(nodes)} nodes", items, None, AT)


def test_one_node_keeps_its_own_message() -> None:
    one = group(["node1"])
    assert not is_digest(one) and render_alert(one) == render_alert_group(one)


def test_a_digest_of_300_nodes_is_one_short_message() -> None:
    nodes = [f"rack7-gpu-node-{i:03d}.example.org" for i in range(300)]
    g = group(nodes, resolved=100)
    msg = render_alert(g)
    assert msg.title == "⚠ hidden GPU holder on 300 nodes: 200 of 300 findings open"
    assert not any(isinstance(p, Actions) for p in msg.body)  # the buttons are in the thread
    payload = to_slack(msg)
    assert len(payload["blocks"]) <= 6
    said = str(payload["blocks"])
    assert "open on 200:" in said and "resolved on 100:" in said and "more" in said
    assert nodes[100] in said and nodes[-1] not in said  # listed up to the clip, then counted
    replies = render_digest_details(g)
    assert len(replies) == 11  # 500 blocks (200 open: section + buttons; 100 resolved), 49 a reply
    assert all(len(to_slack(r)["blocks"]) <= 50 for r in replies)
    sections = [p for r in replies for p in r.body if isinstance(p, Section)]
    assert len(sections) == 300 + len(replies)  # every finding, and each reply's heading line
