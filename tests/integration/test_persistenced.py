"""A box running nvidia-persistenced, as most datacenter boxes do, with and without sudo.

The daemon holds every GPU's device file (NVIDIA's driver README says so) and no memory. It is
not a job: it counts on no GPU, never hides a leak, and is left alone by resets. With persistence
mode on, ``nvidia-smi --gpu-reset`` fails with "In use by another client" (a public incident
write-up shows the daemon letting go of one GPU's file after ``nvidia-smi -i N -pm 0``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.config import Settings
from gpubot.core.findings import ORPHANED_VRAM
from gpubot.core.flags import gpu_flags
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.core.reset.protect import DEFAULT_DAEMON_PATHS
from gpubot.errors import ResetRefused
from gpubot.services.reset import Ask, NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.services.sweep import SweepService
from gpubot.store import Store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode
from gpusim.sudoers import readme_sudo_rule
from tests.fixtures.fleet import reset_fixtures, status_notes
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.procs import alive

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module", params=["plain", "sudo"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    rule = readme_sudo_rule(README) if request.param == "sudo" else None
    with SimFleet(
        tmp_path_factory.mktemp("persistenced"),
        nodes=1,
        gpus=4,
        release_delay_s=0.3,
        persistenced=True,
        protected=DEFAULT_DAEMON_PATHS,
        sudo_rule=rule,
        minors=[2, 3, 0, 1],
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures()


def engine_for(settings: Settings, store: Store) -> tuple[ResetService, object]:
    transport = make_transport(settings.ssh)
    svc = ResetService(
        settings, transport, store, StatusService(settings, transport, store), NodeLocks()
    )
    return svc, transport


def holders(path: str) -> set[int]:
    out = subprocess.run(["fuser", path], capture_output=True, text=True).stdout
    return {int(w) for w in out.split() if w.isdigit()}


def daemon_pid(node: SimNode) -> int:
    (pid,) = holders(node.device(0)) & holders(node.device(3))
    return pid


async def test_the_daemon_is_shown_apart_and_hides_no_leak(
    engine: ResetService, settings: Settings, store: Store, node: SimNode, fleet: SimFleet
) -> None:
    daemon = daemon_pid(node)
    leak = node.spawn(gpu=2, mib=3000, behaviour="orphan")
    os.kill(leak.pid, signal.SIGKILL)
    job = node.spawn(gpu=1, mib=1000)
    snap = await engine.status.snapshot(engine.status.node("node1"))
    for g in snap.gpus:
        (d,) = [p for p in snap.on_gpu(g.index) if p.pid == daemon]
        assert d.system and d.user == "root" and d.process_name == "nvidia-persiste"
    assert "no-process-memory" in gpu_flags(snap.gpus[2], snap.on_gpu(2))
    assert "hidden" not in gpu_flags(snap.gpus[0], snap.on_gpu(0))
    text, doc = status_notes(fleet.config_path, "node1")
    assert f"system: nvidia-persiste ({daemon})" in text
    assert all(any(p["pid"] == daemon and p["system"] for p in g["processes"]) for g in doc["gpus"])
    assert "no-process-memory" in doc["gpus"][2]["flags"]
    sweep = SweepService(
        s := with_sweep(settings, interval_s=60),
        engine.status,
        engine.transport,
        sweep_ports(s, store),
        replica="test",
    )
    found = {(f.kind, f.gpu) for f in (await sweep.run()).findings}
    assert found == {(ORPHANED_VRAM, 2)}

    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(1,)))
    assert [t.pid for t in plan.targets] == [job.pid]
    assert [(s.pid, s.protected) for s in plan.skipped] == [(daemon, True)]
    with pytest.raises(ResetRefused, match="protected system daemon"):
        await engine.plan(ResetRequest("node1", "root", pids=(daemon,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]  # the daemon holds no memory
    assert alive(daemon) and not alive(job.pid)


async def test_gpu_reset_under_persistence_mode(
    engine: ResetService, settings: Settings, store: Store, node: SimNode
) -> None:
    daemon = daemon_pid(node)
    leak = node.spawn(gpu=3, mib=2000, behaviour="orphan")
    os.kill(leak.pid, signal.SIGKILL)
    with pytest.raises(ResetRefused, match=r"In use by another client.*toggle_persistence"):
        await engine.gpu_reset("node1", 3, Ask.by("t", "t", "t"))

    on = dataclasses.replace(settings.reset, toggle_persistence=True)
    toggled = dataclasses.replace(settings, reset=on)
    svc, _ = engine_for(toggled, store)
    try:
        r = await svc.gpu_reset("node1", 3, Ask.by("t", "t", "t"))
    finally:
        await svc.transport.close()
    assert [g.outcome for g in r.gpus] == [Outcome.FREED], r.gpus
    modes = [(s.data["mode"], s.data["exit_status"]) for s in r.steps if s.kind == "persistence"]
    assert modes == [(0, 0), (1, 0)]
    # each of the three commands wrote its line on the node, in the same exec (issue 37)
    said = [x.split(": ", 1)[1] for x in node.kernel.user_lines("gpubot")[-3:]]
    tail = f' by "t", audit #{r.action_id}'
    assert said == [
        f"persistence mode off for the GPU reset (nvidia-smi -pm 0 -i 3){tail}",
        f"GPU reset (nvidia-smi --gpu-reset -i 3){tail}",
        f"persistence mode back on after the GPU reset (nvidia-smi -pm 1 -i 3){tail}",
    ]
    deadline = time.monotonic() + 5  # persistence mode is back on: the daemon holds GPU 3 again
    while daemon not in holders(node.device(3)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if node.sudo:
        assert all(c["verdict"] == "run" for c in node.sudo_log())
        assert {" ".join(c["argv"][2:4]) for c in node.sudo_log() if "-pm" in c["argv"]} == {
            "-pm 0",
            "-pm 1",
        }
