"""A chat fleet answer with nodes read from Prometheus (issue 38): the CLI's rows
(``text_table.telemetry_rows``), nodes whose DCGM saw an Xid first, the rest counted where a
fleet is larger than a table, the fallback note once, and every message within Slack's limits
as ``benchmarks/slack_limits.py`` reads Slack's documentation."""

from __future__ import annotations

from benchmarks import slack_limits
from gpubot.chat.fleet_view import render_fleet
from gpubot.chat.message import Context, Table
from gpubot.core.telemetry import PromGpu, PromNode
from gpubot.core.text_table import PROM_HEADER
from gpubot.slack.render import to_slack

NOTE = (
    "prometheus http://p:9090: no answer, or one older than 120 s, for 1 node(s): n9: read over SSH"
)


def fleet(n: int, xid_at: int) -> tuple[PromNode, ...]:
    def gpu(i: int, g: int) -> PromGpu:
        xid = 79 if i == xid_at and g == 3 else None
        return PromGpu(g, f"GPU-{i}-{g}", "NVIDIA L40S", 1024 * g, 46067, 10, xid, 7.0 + i % 5)

    return tuple(PromNode(f"node{i}", tuple(gpu(i, g) for g in range(8))) for i in range(1, n + 1))


def test_a_large_fleet_lists_xids_first_and_counts_the_rest() -> None:
    msg = render_fleet((), {}, title="GPU status · all", telemetry=fleet(150, 120), notes=(NOTE,))
    (table,) = [p for p in msg.body if isinstance(p, Table)]
    assert table.rows[0] == PROM_HEADER and len(table.rows) == 100
    assert table.rows[1][0] == "node120" and table.rows[1][5] == "79"
    assert table.rows[1][1:4] == ("8", "7", "28.0 / 359.9")
    said = ["".join(str(t) for t in c.parts) for c in msg.body if isinstance(c, Context)]
    assert sum(NOTE in s for s in said) == 1 and any("99 of 150 nodes listed" in s for s in said)
    assert msg.fallback is not None and "from Prometheus: 150 node(s), 1200 GPUs" in msg.fallback
    out = to_slack(msg)
    message = {"text": out["text"], "blocks": out["blocks"]}
    assert slack_limits.problems(message, view=False) + slack_limits.advice(message) == []


def test_control_without_prometheus_nodes_there_is_no_such_table() -> None:
    msg = render_fleet((), {"n1": "unreachable", "n2": "unreachable"}, title="GPU status · all")
    assert not [p for p in msg.body if isinstance(p, Table)]
    assert msg.fallback is not None and "Prometheus" not in msg.fallback
