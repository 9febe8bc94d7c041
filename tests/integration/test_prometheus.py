"""gpubot against a real Prometheus (Debian's) scraping real dcgm-exporter output.

The exporter serves the corpus's dcgm-exporter samples verbatim (tests/corpus/dcgm/); what
Prometheus answers is compared with a brute-force reading of the same text
(``tests.fixtures.prometheus.dcgm_truth``), never with numbers written here.
"""

from __future__ import annotations

import math
import socket
from typing import Any

import pytest

from gpubot.core.telemetry import PromLabels, PromNode, PromSettings, summarize
from gpubot.errors import PrometheusFailed
from gpubot.sources.prometheus import PromClient
from tests.fixtures.daemons import StartError
from tests.fixtures.prometheus import Exporter, Prometheus, dcgm_samples, dcgm_truth


def test_the_fixture_prometheus_holds_what_the_exporter_served(prometheus: Prometheus) -> None:
    truth = _truth()
    got = {
        (r["metric"]["Hostname"], r["metric"]["UUID"]): int(float(r["value"][1]))
        for r in prometheus.query("DCGM_FI_DEV_FB_USED")
    }
    want = {(h, u): g["used"] for h, gpus in truth.items() for u, g in gpus.items()}
    assert len(want) == 3 and got == want


def test_a_prometheus_that_cannot_start_fails_with_its_own_words() -> None:
    exporter = Exporter({"x": "up_total 1\n"})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        prom = Prometheus(exporter, port=taken.getsockname()[1])
        try:
            with pytest.raises(StartError, match="prometheus exited with status") as err:
                prom.start()
            assert "address already in use" in str(err.value)  # its log line, not only ours
        finally:
            prom.stop()
            exporter.close()


def _truth() -> dict[str, dict[str, dict[str, Any]]]:
    return {h: g for text in dcgm_samples().values() for h, g in dcgm_truth(text).items()}


def _as_truth(nodes: dict[str, PromNode]) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        n.node: {
            g.uuid: {
                "gpu": g.index,
                "model": g.model,
                "used": g.used_mib,
                "total": g.total_mib,
                "util": g.utilization_pct,
                "xid": g.last_xid,
            }
            for g in n.gpus
        }
        for n in nodes.values()
    }


async def test_the_promql_summary_says_what_the_exporters_text_says(
    prometheus: Prometheus,
) -> None:
    client = PromClient(PromSettings(url=prometheus.url), None)
    try:
        nodes = summarize(await client.summary_vectors(), PromLabels())
    finally:
        await client.close()
    assert _as_truth(nodes) == _truth() and len(nodes) == 3
    # each GPU's age: a scrape old (one a second), never negative
    assert all(0 <= g.age_s < 30 for n in nodes.values() for g in n.gpus)


async def test_a_prometheus_that_is_down_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    client = PromClient(PromSettings(url=f"http://127.0.0.1:{port}", timeout_s=5), None)
    try:
        with pytest.raises(
            PrometheusFailed, match=r"^prometheus http://127\.0\.0\.1:.*no connection"
        ):
            await client.summary_vectors()
    finally:
        await client.close()


async def test_promql_errors_are_one_line(prometheus: Prometheus) -> None:
    client = PromClient(PromSettings(url=prometheus.url), None)
    try:
        with pytest.raises(PrometheusFailed) as err:
            await client.query("max by (")
    finally:
        await client.close()
    assert "HTTP 400" in str(err.value) and "\n" not in str(err.value)


async def test_a_field_the_exporter_stops_giving_leaves_its_gpu_never_fresh(
    prometheus: Prometheus,
) -> None:
    """The age is the memory reading's: a field the exporter no longer gives is stale at the next
    scrape (Prometheus's staleness marker), so no longer answered, and its GPU is never fresh."""
    name = "cncf-upcloud-l40s"
    text = dcgm_samples()[name]
    (host,) = dcgm_truth(text)
    cut = "\n".join(line for line in text.splitlines() if "DCGM_FI_DEV_GPU_UTIL" not in line)

    async def ages() -> dict[str, float]:
        client = PromClient(PromSettings(url=prometheus.url), None)
        try:
            nodes = summarize(await client.summary_vectors(), PromLabels())
        finally:
            await client.close()
        return {n.node: n.age_s for n in nodes.values()}

    prometheus.exporter.serve(name, cut + "\n")
    try:
        prometheus.wait_scraped()
        without = await ages()
    finally:
        prometheus.exporter.serve(name, text)
        prometheus.wait_scraped()
    assert math.isinf(without[host]) and all(a < 30 for h, a in without.items() if h != host)
    assert (await ages())[host] < 30  # control: given again, fresh again
