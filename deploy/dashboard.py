"""Generate ``deploy/grafana-dashboard.json``, a Grafana dashboard for the metrics that
``gpubot serve`` exports (``gpubot/metrics.py``), with grafanalib.

    python deploy/dashboard.py > deploy/grafana-dashboard.json

``tests/integration/test_packaging_deploy.py`` fails when the checked-in JSON is not what this
prints, or when a query names a series gpubot does not export. Import the JSON in Grafana
(Dashboards → New → Import) and pick the Prometheus data source that scrapes gpubot.

The "Holders and power" table joins gpubot's holders with dcgm-exporter's power by GPU UUID.
dcgm-exporter names it ``UUID``, gpubot ``uuid``: the join renames it in the query
(``label_replace``), so it needs nothing of the site's Prometheus; a Prometheus that renames it
at scrape time (``deploy/prometheus-dcgm-relabel.yml``) may drop the ``label_replace``.
``tests/integration/test_prometheus_join.py`` runs the table's queries against a real
Prometheus scraping gpubot and recorded dcgm-exporter output.
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


def power_by_uuid(series: str = "DCGM_FI_DEV_POWER_USAGE") -> str:
    """dcgm-exporter's ``series`` with its ``UUID`` label copied to gpubot's ``uuid``, one per
    GPU (MIG instances and a second scrape job repeat a GPU's series)."""
    return f'max by (uuid) (label_replace({series}, "uuid", "$1", "UUID", "(.+)"))'


def holders_and_power(pos: tuple[int, int]) -> g.Table:
    """One row per holder of a GPU: gpubot's user, workload and memory, beside the power
    dcgm-exporter reads for that GPU (joined on ``uuid``; empty where it reads none)."""
    by = "node, gpu, uuid, user, workload"
    held = f"gpubot_gpu_holder_memory_bytes{{{NODE}}}"
    power = f"max by ({by}) (0 * {held} + on (uuid) group_left () {power_by_uuid()})"
    # Grafana's organize orders by the frame's own names, then renames.
    columns = ["node", "gpu", "user", "workload", "Value #A", "Value #B", "uuid"]

    def unit(column: str, unit: str) -> dict[str, object]:
        return {
            "matcher": {"id": "byName", "options": column},
            "properties": [{"id": "unit", "value": unit}],
        }

    return g.Table(
        title="Holders and power (gpubot's holders, dcgm-exporter's power, by GPU UUID)",
        dataSource=DS,
        targets=[
            g.Target(expr=f"sum by ({by}) ({held})", format="table", instant=True, refId="A"),
            g.Target(expr=power, format="table", instant=True, refId="B"),
        ],
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {c: i for i, c in enumerate(columns)},
                    "renameByName": {"Value #A": "memory", "Value #B": "power"},
                },
            },
        ],
        overrides=[unit("memory", g.BYTES_FORMAT), unit("power", g.WATT_FORMAT)],
        sortBy=[g.TableSortByField(displayName="memory", desc=True)],
        gridPos=g.GridPos(h=H, w=W, x=pos[0], y=pos[1]),
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
        holders_and_power((W, 3 * H)),
    ]


def dashboard() -> g.Dashboard:
    return g.Dashboard(
        title="gpubot",
        uid="gpubot",
        description="GPU memory and utilisation from gpubot's sweeps, findings, resets, "
        "sweep durations, node failures, the bot's event loop, and each GPU's holders beside "
        "dcgm-exporter's power",
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
