"""A sweep of 64 simulated nodes, 8 of them with a hung nvidia-smi: within budget, exactly 8."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from gpubot.app import build
from gpubot.config import load
from gpubot.services.sweep import SweepService
from gpusim.fleet import SimFleet
from tests.fixtures.settings import with_sweep


async def test_64_nodes_with_8_hung(fleet_factory: Callable[..., SimFleet]) -> None:
    fleet = fleet_factory(nodes=64, gpus=1)
    hung = {f"node{i}" for i in range(8, 65, 8)}
    for name in hung:
        fleet.node(name).set_fault("hang")
    fleet.node("node5").spawn(gpu=0, mib=2048)  # the others are not idle boxes only
    s = load(fleet.config_path)
    # The probe gives nvidia-smi the command timeout less 2 s (here 10 s) before calling it hung;
    # 12 s lets a healthy node answer even at a load of 20 (6 s did not).
    ssh = dataclasses.replace(s.ssh, command_timeout_s=12.0, connect_timeout_s=12.0)
    budget = 60.0
    s = with_sweep(dataclasses.replace(s, ssh=ssh), interval_s=60, budget_s=budget)
    app = build(s, {}, need_store=False)
    svc = SweepService(s, app.status, app.transport)
    try:
        started = time.monotonic()
        result = await svc.run(alerting=False)
        took = time.monotonic() - started
    finally:
        await app.close()
    assert took < budget and result.seconds < svc.node_budget_s(), took
    # Every hung node failed; a healthy one may too, but only by running out of time on a box
    # far busier than its cores (seen at a load of 15): never by a wrong answer.
    failed = set(result.failed)
    assert hung <= failed
    # Each one did not answer: nvidia-smi hung (the probe's own timeout), or on a loaded box
    # the whole probe ran past the command timeout first.
    for name, f in result.failed.items():
        assert (name in hung and (f.kind.value, "hung" in f.reason) == ("smi-failed", True)) or (
            f.kind.value == "node-slow" and "no answer in 12s" in f.reason
        ), f
    assert {(f.node, f.gpu) for f in result.findings} == {(n, None) for n in failed}
    assert len(result.snapshots) == 64 - len(failed)
    assert {s.node for s in result.snapshots}.isdisjoint(failed)
    for snap in result.snapshots:
        if snap.node == "node5":
            assert snap.gpus[0].memory_used_mib == 2048
