"""``StatusService.summary``: summaries asked while one is in flight join it, as ``fleet``'s
rounds do, so a burst of ``/gpu status all`` reads Prometheus once and shares one answer (which
the chat renders once); a summary asked after one ends reads again (no stale answer)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.telemetry import AGE, PROMETHEUS, CandidateRule
from gpubot.services.status import Sources, StatusService
from tests.fixtures.recorded import recorded, settings


class NoSsh:
    """Every node is read from Prometheus here: a probe is a failure of the test."""

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        raise AssertionError(f"{node.name} probed over SSH")

    async def close(self) -> None:
        return None


class Gated:
    """A Prometheus that answers once ``gate`` is set, counting the summaries asked of it."""

    url = "http://prometheus.test:9090"

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = nodes
        self.asked = 0
        self.gate = asyncio.Event()

    async def summary_vectors(self) -> Mapping[str, list[dict[str, Any]]]:
        self.asked += 1
        await self.gate.wait()
        now = 1000.0
        gpus = [
            {"Hostname": n, "UUID": f"GPU-{n}", "gpu": "0", "modelName": "A100"} for n in self.nodes
        ]
        return {
            "used": [{"metric": g, "value": [now, "10"]} for g in gpus],
            "free": [{"metric": g, "value": [now, "90"]} for g in gpus],
            "util": [{"metric": g, "value": [now, "0"]} for g in gpus],
            AGE: [{"metric": g, "value": [now, str(now - 5)]} for g in gpus],
        }

    async def candidate_vectors(self, rule: CandidateRule) -> Mapping[str, list[dict[str, Any]]]:
        raise AssertionError("a summary asks for no sweep candidates")

    async def close(self) -> None:
        return None


def service() -> tuple[StatusService, Gated]:
    prefix, _ = recorded("sim-idle")
    s = settings(prefix)
    s = dataclasses.replace(
        s, nodes=tuple(dataclasses.replace(n, telemetry=PROMETHEUS) for n in s.nodes)
    )
    prom = Gated([n.name for n in s.nodes])
    return StatusService(s, NoSsh(), sources=Sources(prom=prom)), prom


async def test_a_burst_of_summaries_reads_prometheus_once_and_shares_the_answer() -> None:
    status, prom = service()
    burst = [asyncio.ensure_future(status.summary(["all"])) for _ in range(5)]
    for _ in range(10):  # every caller has asked
        await asyncio.sleep(0)
    prom.gate.set()
    answers = await asyncio.gather(*burst)
    assert prom.asked == 1 and all(a is answers[0] for a in answers)
    assert [n.node for n in answers[0].telemetry] == [n.name for n in status.settings.nodes]
    assert answers[0].notes == () and all(n.age_s == 5.0 for n in answers[0].telemetry)
    # control: once the summary has ended, the next one reads Prometheus again
    again = await status.summary(["all"])
    assert prom.asked == 2 and again is not answers[0]
