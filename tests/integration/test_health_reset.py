"""A pending row remap through gpubot's guarded gpu-reset (issue 27), over real SSH.

While a job holds the GPU, gpu-reset refuses ("still has processes"): the finding's next step
is to stop it first, through the Reset flow (approval where the job is someone else's). Once the
GPU is idle the reset runs, the simulated driver applies the remap (as the real one does on a
reset) and the next health read finds nothing pending.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from gpubot.core.models import Outcome
from gpubot.services.health_checks import HealthChecks
from gpubot.services.reset import Ask, ResetService
from gpusim import health_faults as hf
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import reset_fixtures
from tests.procs import wait_dead


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("hreset"), nodes=1, gpus=2, release_delay_s=0.3) as f:
        yield f


settings, store, engine, node = reset_fixtures(verify_timeout_s=8.0)


async def test_a_pending_remap_is_applied_by_the_guarded_gpu_reset(
    engine: ResetService, node: SimNode
) -> None:
    hf.set_gpu(node, 1, remap_pending=True)
    job = node.spawn(gpu=1, mib=2048)
    checks = HealthChecks(engine.transport)
    cfg = engine.status.node("node1")

    async def found() -> list[str]:
        snap = await checks.attach(cfg, await engine.status.snapshot(cfg))
        out = await checks.findings([snap], advance=False)
        return [x.summary for x in out if x.kind.value == "memory-repair-pending"]

    (busy,) = await found()
    assert "1 process(es) hold it: stop them first" in busy
    with pytest.raises(Exception, match="still has processes"):
        await engine.gpu_reset("node1", 1, Ask.by("t", "t", "t"))
    assert await found() == [busy]  # refused: nothing changed on the GPU

    os.kill(job.pid, signal.SIGKILL)  # the job this test started, by pid
    wait_dead(job.pid)
    (idle,) = await found()
    assert idle.endswith("it is idle: gpu-reset node1 gpu 1 now")
    r = await engine.gpu_reset("node1", 1, Ask.by("t", "t", "t"))
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]
    assert await found() == []  # the reset applied the remap
