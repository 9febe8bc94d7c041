"""Generate ``deploy/grafana-dashboard.json``, a Grafana dashboard for the metrics that
``gpubot serve`` exports (``gpubot/metrics.py``), with grafanalib.

    python deploy/dashboard.py > deploy/grafana-dashboard.json

``tests/integration/test_packaging_deploy.py`` fails when the checked-in JSON is not what this
prints, or when a query names a series gpubot does not export. Import the JSON in Grafana
(Dashboards → New → Import) and pick the Prometheus data source that scrapes gpubot.
"""

from __future__ import annotations

import json

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

DS = "${datasource}"
NODE = 'node=~"$node"'
RATE = "$__rate_interval"
W, H = 12, 8  # half the width, a row's height


def ts(
    title: str, exprs: list[tuple[str, str]], unit: str, pos: tuple[int, int], **kw: object
) -> g.TimeSeries:
    """A time series panel at grid ``pos`` (x, y) with one target per (expr, legend)."""
    return g.TimeSeries(
        title=title,
        dataSource=DS,
        targets=[
            g.Target(expr=e, legendFormat=legend, refId=chr(ord("A") + i))
            for i, (e, legend) in enumerate(exprs)
        ],
        unit=unit,
        gridPos=g.GridPos(h=H, w=W, x=pos[0], y=pos[1]),
        **kw,
    )


def quantile(q: float, histogram: str) -> str:
    """The ``q`` quantile of a histogram over the dashboard's rate interval."""
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{RATE}])))"


def panels() -> list[g.Panel]:
    per_gpu = "{{node}} GPU {{gpu}}"
    used = f"gpubot_gpu_memory_used_bytes{{{NODE}}}"
    total = f"gpubot_gpu_memory_total_bytes{{{NODE}}}"
    sweep = "gpubot_sweep_duration_seconds"
    mean = f"rate({sweep}_sum[{RATE}]) / rate({sweep}_count[{RATE}])"
    failures = f"gpubot_node_failures_total{{{NODE}}}"
    resets = f"sum by (outcome) (increase(gpubot_resets_total[{RATE}]))"
    ratio = {"valueMin": 0, "valueMax": 1}
    return [
        ts(
            "GPU memory used",
            [(f"{used} / {total}", per_gpu)],
            g.PERCENT_UNIT_FORMAT,
            (0, 0),
            **ratio,
        ),
        ts(
            "GPU utilisation",
            [(f"gpubot_gpu_utilization_ratio{{{NODE}}}", per_gpu)],
            g.PERCENT_UNIT_FORMAT,
            (W, 0),
            **ratio,
        ),
        ts(
            "Open sweep findings",
            [("sum by (kind) (gpubot_findings_open)", "{{kind}}")],
            g.SHORT_FORMAT,
            (0, H),
            stacking={"mode": "normal"},
        ),
        ts(
            "GPUs reset, by outcome",
            [(resets, "{{outcome}}")],
            g.SHORT_FORMAT,
            (W, H),
            drawStyle="bars",
        ),
        ts(
            "Sweep duration",
            [(quantile(0.5, sweep), "p50"), (quantile(0.95, sweep), "p95"), (mean, "mean")],
            g.SECONDS_FORMAT,
            (0, 2 * H),
        ),
        ts(
            "Nodes without a usable answer",
            [(f"sum by (node) (increase({failures}[{RATE}]))", "{{node}}")],
            g.SHORT_FORMAT,
            (W, 2 * H),
            drawStyle="bars",
        ),
        ts(
            "Event loop stalls (Slack waits 3 s for an acknowledgement)",
            [
                (quantile(0.99, "gpubot_event_loop_stall_seconds"), "p99 stall"),
                ("gpubot_event_loop_max_stall_seconds", "longest since start ({{instance}})"),
            ],
            g.SECONDS_FORMAT,
            (0, 3 * H),
        ),
    ]


def dashboard() -> g.Dashboard:
    return g.Dashboard(
        title="gpubot",
        uid="gpubot",
        description="GPU memory and utilisation from gpubot's sweeps, findings, resets, "
        "sweep durations, node failures and the bot's event loop",
        tags=["gpubot", "gpu"],
        timezone="utc",
        refresh="1m",
        time=g.Time("now-6h", "now"),
        templating=g.Templating(
            list=[
                g.Template(
                    name="datasource", label="Data source", query="prometheus", type="datasource"
                ),
                g.Template(
                    name="node",
                    label="Node",
                    dataSource=DS,
                    query="label_values(gpubot_gpu_memory_total_bytes, node)",
                    includeAll=True,
                    multi=True,
                    default="$__all",
                    refresh=2,
                ),
            ]
        ),
        panels=panels(),
    ).auto_panel_ids()


def render() -> str:
    """Return the dashboard as the JSON Grafana imports (stable: sorted keys)."""
    doc = dashboard().to_json_data()
    return json.dumps(doc, cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


if __name__ == "__main__":
    print(render(), end="")
