"""A ``sudo = true`` node whose sudo allows exactly the README's sudoers rule, on both SSH servers.

Every behaviour of gpubot works there (status with a hidden holder, SIGTERM, SIGKILL, the respawn
check, a GPU reset), and every command gpubot ran through ``sudo -n`` was one the rule allows.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, ResetResult, ResetService
from gpusim.fleet import SimFleet, SimNode
from gpusim.sudoers import readme_sudo_rule
from tests.fixtures.fleet import reset_fixtures
from tests.procs import alive

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module", params=["asyncssh", "sshd"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("sudo-node"),
        nodes=1,
        gpus=4,
        release_delay_s=0.3,
        server=request.param,
        sudo_rule=readme_sudo_rule(README),
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures(verify_timeout_s=8.0)


async def reset(engine: ResetService, gpu: int) -> ResetResult:
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(gpu,)))
    return await engine.execute(plan, Ask.by("t", "t", "t"), before=before)


def shapes(node: SimNode) -> list[str]:
    """Every sudo call's shape (the command without its numbers and device paths), in order."""
    out = []
    for call in node.sudo_log():
        assert call["verdict"] == "run", call  # nothing gpubot asked for was refused
        argv = call["argv"]
        assert argv[0] == "-n"
        words = [os.path.basename(argv[1]), *argv[2:4]]
        out.append(" ".join(a for a in words if not a.isdigit() and not a.startswith("/")))
    return out


async def test_every_behaviour_works_with_only_the_readme_rule(
    engine: ResetService, node: SimNode
) -> None:
    assert all(n.sudo for n in engine.settings.nodes)  # the inventory says sudo = true
    node.clear()
    hidden = node.spawn(gpu=0, mib=100, behaviour="hidden")
    snap = await engine.status.snapshot(engine.status.node("node1"))
    (h,) = [p for p in snap.processes if p.pid == hidden.pid]
    assert h.hidden and h.gpu_index == 0  # found only through `sudo -n fuser`

    normal = node.spawn(gpu=1, mib=1000)
    r = await reset(engine, 1)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(normal.pid)

    stubborn = node.spawn(gpu=2, mib=1000, behaviour="stubborn")
    r = await reset(engine, 2)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(stubborn.pid)

    respawn = node.spawn(gpu=3, mib=1000, behaviour="respawn")
    try:
        r = await reset(engine, 3)
        (g,) = r.gpus
        assert g.outcome is Outcome.RESPAWNED  # the parent was read from /proc without sudo
        assert f"parent pid {respawn.supervisor_pid}" in g.detail and "gpusim" in g.detail
    finally:
        assert respawn.supervisor_pid is not None
        os.kill(respawn.supervisor_pid, signal.SIGKILL)

    leak = node.spawn(gpu=1, mib=2000, behaviour="orphan")
    os.kill(leak.pid, signal.SIGKILL)
    r = await engine.gpu_reset("node1", 1, Ask.by("t", "t", "t"))
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]

    used = shapes(node)
    assert set(used) == {"fuser -v", "kill -s TERM", "kill -s KILL", "nvidia-smi --gpu-reset -i"}
