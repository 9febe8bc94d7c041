"""``[prometheus]`` and ``telemetry`` in the settings, and the folding of query answers (pure).

What the queries answer from a real Prometheus is tested in tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load
from gpubot.core.telemetry import AGE, PromLabels, queries, summarize
from gpubot.errors import ConfigError

NODES = """
[[nodes]]
name = "a1"
host = "a1.example"
groups = ["dgx"]

[[nodes]]
name = "b1"
host = "b1.example"

[groups.dgx]
telemetry = "prometheus"
"""


def write(tmp: Path, text: str) -> Path:
    path = tmp / "gpubot.toml"
    path.write_text(text)
    return path


def test_a_group_reads_its_nodes_from_prometheus(tmp_path: Path) -> None:
    text = NODES + '\n[prometheus]\nurl = "http://prom:9090/"\nnode_label = "instance_host"\n'
    s = load(write(tmp_path, text))
    assert [(n.name, n.telemetry) for n in s.nodes] == [("a1", "prometheus"), ("b1", "ssh")]
    p = s.prometheus
    assert (p.url, p.labels.node, p.labels.uuid, p.max_age_s) == (
        "http://prom:9090",
        "instance_host",
        "UUID",
        120.0,
    )
    # control: without the group's key every node is read over SSH, and no server is named
    plain = load(write(tmp_path, NODES.replace('telemetry = "prometheus"', "gpus = 8")))
    assert {n.telemetry for n in plain.nodes} == {"ssh"} and plain.prometheus.url is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[groups.dgx]\ntelemetry = "snmp"', "groups.dgx.telemetry: expected one of ssh, prom"),
        ('[prometheus]\nurl = "prom:9090"', "prometheus.url: expected"),
        ('[prometheus]\nurl = "http://u:pw@prom"', "prometheus.url: expected"),
        ('[prometheus]\ntoken_env = "Bearer abc.def"', "not an environment variable"),
        ('[prometheus]\nnode_label = "host-name"', "prometheus.node_label: 'host-name' is not"),
        ("[prometheus]\nmax_age_s = 0", "prometheus.max_age_s: expected seconds"),
        ('[prometheus]\nurl_x = "http://p"', "url_x"),
    ],
)
def test_bad_prometheus_keys_are_one_line(tmp_path: Path, text: str, said: str) -> None:
    base = NODES.replace('[groups.dgx]\ntelemetry = "prometheus"\n', "")
    with pytest.raises(ConfigError, match=said) as exc:
        load(write(tmp_path, base + "\n" + text + "\n"))
    assert "\n" not in str(exc.value)


def _series(value: str, labels: dict[str, str], t: float = 100.0) -> dict[str, Any]:
    return {"metric": labels, "value": [t, value]}


def test_mig_instances_and_pods_fold_into_their_gpu() -> None:
    g0 = {"Hostname": "n1", "UUID": "GPU-a", "gpu": "0", "modelName": "A800"}
    vectors = {
        "used": [_series("10", g0)],
        "free": [_series("81000", g0)],
        "util": [_series("NaN", g0)],  # not a number: unknown, not 0
        AGE: [_series("97.5", g0)],
        "xid": [_series("0", g0), _series("3", {"Hostname": "n1", "UUID": "GPU-x", "gpu": "zero"})],
    }
    nodes = summarize(vectors, PromLabels())
    (gpu,) = nodes["n1"].gpus
    assert (gpu.used_mib, gpu.total_mib, gpu.utilization_pct, gpu.last_xid) == (
        10,
        81010,
        None,
        None,
    )
    assert gpu.age_s == 2.5 and nodes["n1"].age_s == 2.5
    # control: a GPU with a field unanswered (no longer exported: stale) is never fresh; a NaN
    # utilisation above was answered
    for field in ("util", "free", AGE):
        fewer = {k: v for k, v in vectors.items() if k != field}
        assert math.isinf(summarize(fewer, PromLabels())["n1"].age_s), field


def test_only_the_memory_answer_names_the_gpus() -> None:
    g0 = {"Hostname": "n1", "UUID": "GPU-a"}  # the other answers carry the node and UUID alone
    vectors = {
        "used": [_series("10", g0 | {"gpu": "0", "modelName": "A800"})],
        "free": [_series("90", g0), _series("5", {"Hostname": "n1", "UUID": "GPU-b"})],
        "util": [_series("7", g0), _series("9", {"Hostname": "n2", "UUID": "GPU-a"})],
        AGE: [_series("99", g0)],
    }
    nodes = summarize(vectors, PromLabels())
    (gpu,) = nodes["n1"].gpus  # GPU-b, and n2's GPU-a, are not named by the memory answer
    assert (gpu.index, gpu.model, gpu.total_mib, gpu.utilization_pct) == (0, "A800", 100, 7)
    assert list(nodes) == ["n1"] and gpu.age_s == 1.0


def test_the_queries_use_the_configured_labels() -> None:
    q = queries(PromLabels(node="host"))
    assert q["used"] == "max by (host, UUID, gpu, modelName) (DCGM_FI_DEV_FB_USED)"
    assert q["free"] == "max by (host, UUID) (DCGM_FI_DEV_FB_FREE)"
    assert q[AGE] == "min by (host, UUID) (timestamp(DCGM_FI_DEV_FB_USED))"
    assert len(q) == 6  # one query a field, one of the sample times
    assert "Hostname" not in "".join(q.values())
