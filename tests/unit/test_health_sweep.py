"""The sweep with health checks over the scripted transport (milliseconds): the recorded node's
probe answer, and a health exec that answers, fails or does not answer in time."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpubot.config import Settings
from gpubot.core.models import CommandResult
from gpubot.errors import CommandTimeout
from gpubot.services import health_checks
from gpubot.services.health_checks import HealthChecks
from gpubot.services.status import StatusService
from gpubot.services.sweep import SweepPorts, SweepService
from gpubot.transport import ScriptedTransport
from gpubot.transport.scripted import Call, answer, completed
from tests.fixtures.recorded import recorded, settings
from tests.fixtures.settings import with_sweep

PENDING = (
    "\n@gpubot health r535 0\n"
    "0, 0, 0, No, Yes, No, Not Active, Not Active, Not Active, 35, 70.00, [N/A], [N/A], 700.00\n"
    "1, 0, 0, No, No, No, Not Active, Not Active, Not Active, 35, 70.00, [N/A], [N/A], 700.00\n"
    "\n@gpubot nvlink 0\n\n@gpubot fm none\n@gpubot end\n"
)


def _sweep(health: object, budget_s: float = 20.0) -> tuple[SweepService, list[Call]]:
    prefix, probe = recorded("sim-idle")
    s: Settings = with_sweep(settings(prefix), interval_s=60, budget_s=budget_s)
    calls: list[Call] = []

    def on_health(call: Call) -> CommandResult | CommandTimeout:
        calls.append(call)
        if health == "slow":
            return CommandTimeout(call.node.name, f"no answer in {call.timeout:g}s")
        return completed(call.argv, str(health))

    transport = ScriptedTransport(answer({"gpubot-probe": probe, "gpubot-health": on_health}))
    checks = HealthChecks(transport, timeout_s=8.0)
    status = StatusService(s, transport)
    return SweepService(s, status, transport, SweepPorts(health=checks)), calls


async def test_the_health_exec_finds_a_pending_remap() -> None:
    svc, calls = _sweep(PENDING)
    result = await svc.run(alerting=False)
    assert {(f.node, f.gpu, f.kind.value) for f in result.findings} == {
        ("node1", 0, "memory-repair-pending"),
        ("node2", 0, "memory-repair-pending"),
    }
    assert len(calls) == 2 and all(c.timeout == 8.0 for c in calls)


async def test_a_health_exec_that_does_not_answer_leaves_the_node_answered() -> None:
    svc, calls = _sweep("slow", budget_s=4.0)
    result = await svc.run(alerting=False)
    assert result.failed == {} and len(result.snapshots) == 2 and result.findings == ()
    assert all(any("health not read" in n for n in s.notes) for s in result.snapshots)
    # bounded by what was left of the node budget, not by the checks' own 8 s
    assert calls and all(c.timeout is not None and c.timeout < 4.0 for c in calls)


async def test_a_failed_health_query_is_a_note_not_a_finding() -> None:
    svc, _ = _sweep("\n@gpubot health old 9\nNVIDIA-SMI has failed\n@gpubot end\n")
    result = await svc.run(alerting=False)
    assert result.failed == {} and result.findings == ()
    assert all(any("health query failed" in n for n in s.notes) for s in result.snapshots)


async def test_parsing_attaching_and_findings_run_in_the_worker_not_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the loop, 2,000 nodes' health held it 1.2-1.6 s in one sweep (issue 24)."""
    where: dict[str, set[str]] = {}
    for name in ("parse_health", "with_health", "find_health"):
        real = getattr(health_checks, name)

        def spy(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            where.setdefault(_name, set()).add(threading.current_thread().name)
            return _real(*a, **k)

        monkeypatch.setattr(health_checks, name, spy)
    svc, _ = _sweep(PENDING)
    result = await svc.run(alerting=True)
    assert len(result.findings) == 2  # the same findings as on the loop (the first test)
    assert set(where) == {"parse_health", "with_health", "find_health"}
    loop = threading.current_thread().name
    assert all(t.startswith("gpubot-cpu") and t != loop for ts in where.values() for t in ts)
