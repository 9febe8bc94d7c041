"""A box whose device files are numbered apart from its GPU indices, on both SSH servers.

NVIDIA orders GPU indices by PCI bus (or CUDA_DEVICE_ORDER) while the driver assigns each GPU's
device minor: ``/dev/nvidiaN`` is the GPU whose ``/proc/driver/nvidia/gpus/<bus>/information``
says ``Device Minor: N``, which need not be GPU N. Here GPU i opens ``nvidia{3 - i}``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpubot.config import Settings
from gpubot.core.findings import HIDDEN_HOLDER
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, ResetResult, ResetService
from gpubot.services.sweep import SweepService
from gpubot.store import Store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import reset_fixtures, status_notes
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.procs import alive

MINORS = [3, 2, 1, 0]


@pytest.fixture(scope="module", params=["asyncssh", "sshd"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("minors"),
        nodes=1,
        gpus=4,
        release_delay_s=0.3,
        server=request.param,
        minors=MINORS,
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures(verify_timeout_s=8.0)


async def reset(engine: ResetService, gpu: int) -> ResetResult:
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(gpu,)))
    return await engine.execute(plan, Ask.by("t", "t", "t"), before=before)


async def test_a_reset_never_signals_a_process_on_another_gpu(
    engine: ResetService, node: SimNode, fleet: SimFleet, settings: Settings, store: Store
) -> None:
    assert node.device(0) == f"{node.dev_prefix}3"  # GPU 0's job holds nvidia3
    on0 = node.spawn(gpu=0, mib=1000)
    on3 = node.spawn(gpu=3, mib=2000)
    hidden1 = node.spawn(gpu=1, mib=500, behaviour="hidden")  # only its device file tells
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert [(g.index, g.minor) for g in snap.gpus] == list(enumerate(MINORS))
    assert {(p.pid, p.gpu_index, p.hidden) for p in snap.processes} == {
        (on0.pid, 0, False),
        (on3.pid, 3, False),
        (hidden1.pid, 1, True),
    }
    text, doc = status_notes(fleet.config_path, "node1")
    assert [g["device_minor"] for g in doc["gpus"]] == MINORS
    assert [[p["pid"] for p in g["processes"]] for g in doc["gpus"]] == [
        [on0.pid],
        [hidden1.pid],
        [],
        [on3.pid],
    ]
    assert str(hidden1.pid) in text and "hidden" in text
    sweep = SweepService(
        s := with_sweep(settings, interval_s=60),
        engine.status,
        engine.transport,
        sweep_ports(s, store),
        replica="test",
    )
    found = {(f.kind, f.gpu, f.pid) for f in (await sweep.run()).findings}
    assert found == {(HIDDEN_HOLDER, 1, hidden1.pid)}

    r = await reset(engine, 3)  # index 3 is nvidia0: under index == minor, on0 would die
    assert [t.pid for t in r.plan.targets] == [on3.pid]
    assert {s.data["pid"] for s in r.steps if s.kind == "signal"} == {on3.pid}
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]
    assert alive(on0.pid) and alive(hidden1.pid) and not alive(on3.pid)

    r = await reset(engine, 1)  # the hidden holder of nvidia2
    assert [t.pid for t in r.plan.targets] == [hidden1.pid]
    assert alive(on0.pid) and not alive(hidden1.pid)


async def test_gpu_reset_sees_the_holder_through_the_minor(
    engine: ResetService, node: SimNode
) -> None:
    held = node.spawn(gpu=2, mib=0, behaviour="hidden")  # holds nvidia1, no memory listed
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert [(p.pid, p.gpu_index) for p in snap.processes] == [(held.pid, 2)]
    with pytest.raises(Exception, match="still has processes"):
        await engine.gpu_reset("node1", 2, Ask.by("t", "t", "t"))
    r = await engine.gpu_reset("node1", 1, Ask.by("t", "t", "t"))  # nvidia2: idle
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and alive(held.pid)
