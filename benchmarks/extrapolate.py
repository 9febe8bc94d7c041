"""From the measured fleet sizes to 1,000 nodes: memory, file descriptors, CPU, Slack messages.

Memory and descriptors are fitted (least squares, a line) through the running bot's RSS and open
descriptors at each measured N. The Slack part is measured, not fitted: the real fleet
answer (``gpubot.chat.fleet_view.render_fleet``, as Slack is sent it) is rendered for 1,000
nodes made from snapshots the benchmark fleet really returned, and checked against Slack's
limits.
"""

from __future__ import annotations

import dataclasses
import json
import resource
from collections.abc import Sequence
from typing import Any

from gpubot.chat.fleet_view import render_fleet
from gpubot.chat.layout import MAX_TEXT
from gpubot.core.models import NodeSnapshot
from gpubot.slack.blockkit import MAX_BLOCKS, limit_problems
from gpubot.slack.render import to_slack

TARGET = 1000


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Return (intercept, slope) of the least-squares line through the points."""
    n = len(xs)
    if n == 1:
        return ys[0], 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def slack_at(snapshots: Sequence[NodeSnapshot], nodes: int, failing: int = 0) -> dict[str, Any]:
    """Render the fleet answer for ``nodes`` nodes (``failing`` of them down); measure it."""
    snaps = []
    for i in range(nodes - failing):
        base = snapshots[i % len(snapshots)]
        snaps.append(dataclasses.replace(base, node=f"node{i + 1}"))
    failed = {
        f"node{nodes - failing + i + 1}": "no SSH answer from 10.0.0.1:22 in 5s"
        for i in range(failing)
    }
    msg = to_slack(render_fleet(snaps, failed, seconds=1.0, title="GPU status · all"))
    blocks = msg["blocks"]
    texts = [len(json.dumps(b.get("text", {}).get("text", ""))) - 2 for b in blocks]
    table_rows = sum(len(b.get("rows", [])) - 1 for b in blocks if b.get("type") == "table")
    return {
        "nodes": nodes,
        "failing": failing,
        "blocks": len(blocks),
        "max_text_chars": max(texts, default=0),
        "fallback_chars": len(msg["text"]),
        "nodes_listed": max(0, table_rows),
        "problems": limit_problems(msg),
        "limits": {"blocks": MAX_BLOCKS, "text": MAX_TEXT},
    }


def extrapolate(
    points: dict[int, dict[str, float]], cpu_per_node: dict[int, float]
) -> dict[str, Any]:
    """Fit RSS and descriptors against N; project them and CPU to ``TARGET`` nodes."""
    ns = sorted(points)
    rss0, rss_slope = fit(ns, [points[n]["rss_kib"] for n in ns])
    fd0, fd_slope = fit(ns, [points[n]["fds"] for n in ns])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cpu = [cpu_per_node[n] for n in ns if n in cpu_per_node]
    per_node = max(cpu) if cpu else None
    return {
        "rss_base_kib": rss0,
        "rss_per_node_kib": rss_slope,
        "rss_at_target_mib": (rss0 + rss_slope * TARGET) / 1024,
        "fds_base": fd0,
        "fds_per_node": fd_slope,
        "fds_at_target": fd0 + fd_slope * TARGET,
        "nofile_soft": soft,
        "nofile_hard": hard,
        "cpu_per_node_s": per_node,
        "cpu_at_target_s": per_node * TARGET if per_node is not None else None,
        "target": TARGET,
    }
