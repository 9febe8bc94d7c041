"""The reset engine when the node does not play along: ``nvidia-smi --gpu-reset`` failing, and a
target that is gone by the time its signal goes out. Real processes, real SSH, the real sim.

The moments are exact, not slept for: the engine's own ``on_event`` sink (a reset's "planned"
step) and a hook at the audit port (the intent of a gpu-reset, written just before nvidia-smi
runs) make the node change at that point. The failures themselves are the sim's.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpubot.config import Settings
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, NodeLocks, ResetEvent, ResetService
from gpubot.store import Store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import reset_fixtures
from tests.procs import alive, wait_dead

settings, store, engine, node = reset_fixtures(grace_s=1.0, verify_timeout_s=4.0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("reset-errors"), nodes=1, gpus=4, release_delay_s=0.3
    ) as f:
        yield f


class _OnIntent:
    """The real audit store; right after a reset's intent is written, ``then()`` runs (a hook
    at the port: it only picks the moment, the failure is the sim's)."""

    def __init__(self, store: Store, then: Callable[[], object]) -> None:
        self.store, self.then = store, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def begin_action(self, **kwargs: Any) -> int:
        action_id = await self.store.begin_action(**kwargs)
        self.then()
        return action_id


def _leak(node: SimNode, gpu: int, mib: int) -> None:
    """Leave ``mib`` of orphaned memory on ``gpu`` (what ``--gpu-reset`` is for)."""
    w = node.spawn(gpu=gpu, mib=mib, behaviour="orphan")
    os.kill(w.pid, signal.SIGKILL)
    wait_dead(w.pid)


def _used(node: SimNode, gpu: int) -> int:
    return int(node.state()["gpus"][gpu]["memory_used_mib"])


@pytest.mark.parametrize(
    ("what", "said"),
    [
        (
            "driver-error",
            "nvidia-smi --gpu-reset: NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver.",
        ),
        ("holder", "nvidia-smi --gpu-reset: The following GPUs could not be reset:"),
    ],
    ids=["driver-error", "a-holder-appears"],
)
async def test_a_failed_gpu_reset_is_no_freed_gpu(
    settings: Settings, store: Store, engine: ResetService, node: SimNode, what: str, said: str
) -> None:
    _leak(node, 2, 3000)
    came: list[int] = []

    def meanwhile() -> None:
        if what == "driver-error":
            node.set_fault("driver-error")  # the driver stops answering
        else:  # another job takes the GPU between the look and the reset
            came.append(node.spawn(gpu=2, mib=512, behaviour="hidden").pid)

    hooked = _OnIntent(store, meanwhile)
    svc = ResetService(settings, engine.transport, hooked, engine.status, NodeLocks())
    result = await svc.gpu_reset("node1", 2, Ask.by("t", "t", "gpu-reset node1 2"))
    node.set_fault(None)
    assert not result.ok
    (g,) = result.gpus
    assert g.outcome is not Outcome.FREED
    assert said in g.detail, g.detail
    (step,) = [s for s in result.steps if s.kind == "gpu_reset"]
    assert step.data["exit_status"] == (9 if what == "driver-error" else 255)
    assert _used(node, 2) >= 3000  # the leaked memory is still there, and said to be
    assert all(alive(p) for p in came)  # a reset never signals what came meanwhile
    (action,) = await store.actions()
    assert action.kind == "gpu-reset" and action.status == "not-freed"
    assert (await store.verify()).ok


async def test_a_target_gone_before_its_signal_is_not_signalled_and_counts_as_freed(
    engine: ResetService, store: Store, node: SimNode
) -> None:
    w = node.spawn(gpu=1, mib=2048)
    plan, before = await engine.plan(ResetRequest("node1", None, gpus=(1,)))
    assert [t.pid for t in plan.targets] == [w.pid]

    async def sink(event: ResetEvent) -> None:
        if event.kind == "planned":  # the intent is written; no signal has gone out yet
            os.kill(w.pid, signal.SIGKILL)  # it dies on its own (an OOM kill, a crash)
            wait_dead(w.pid)

    result = await engine.execute(
        plan, Ask.by("t", "t", "reset node1 1", on_event=sink), before=before
    )
    signals = [
        (s.data["pid"], s.data["signal"], s.data["result"])
        for s in result.steps
        if s.kind == "signal"
    ]
    assert signals == [(w.pid, "SIGTERM", "gone")]  # reported, and no SIGKILL after it
    (g,) = result.gpus
    assert g.outcome is Outcome.FREED, g.detail
    (action,) = await store.actions()
    assert action.status == "freed"
