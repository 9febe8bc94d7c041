"""gpubot reaching a node as an ordinary account, with and without /proc mounted hidepid=2.

Without root, ``fuser`` cannot look into other users' processes ("Cannot stat file /proc/PID/fd/…:
Permission denied"), and with hidepid their /proc entries are not there at all. gpubot must say
its view is partial and never turn what it cannot see into a finding or a "freed".
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpubot.config import Settings, load
from gpubot.core.findings import load_sweep_config
from gpubot.core.models import Outcome
from gpubot.core.plan import ResetRequest
from gpubot.services.reset import NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.services.sweep import SweepService
from gpubot.sim.fleet import SimFleet, SimNode
from gpubot.ssh import make_transport
from gpubot.store import Store, open_store
from tests.fixtures.fleet import leave_clean
from tests.procs import alive


@pytest.fixture(scope="module", params=[False, True], ids=["plain-proc", "hidepid"])
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sim_users: tuple[str, ...],
) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("partial"), nodes=1, gpus=4, release_delay_s=0.3,
                  view_user=sim_users[1], hidepid=request.param) as f:  # fmt: skip
        yield f


@pytest.fixture(scope="module")
def settings(fleet: SimFleet) -> Settings:
    s = load(fleet.config_path)
    reset = dataclasses.replace(s.reset, grace_s=0.5, verify_timeout_s=3.0, poll_interval_s=0.2)
    return dataclasses.replace(s, reset=reset, ssh=dataclasses.replace(s.ssh, command_timeout_s=15))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
    st.upgrade()
    yield st
    st.close()


@pytest.fixture
async def engine(settings: Settings, store: Store) -> AsyncIterator[ResetService]:
    transport = make_transport(settings.ssh)
    yield ResetService(settings, transport, store, StatusService(settings, transport, store),
                       NodeLocks())  # fmt: skip
    await transport.close()


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    leave_clean(n)


async def test_a_partial_view_is_said_and_never_taken_for_the_truth(
    engine: ResetService, settings: Settings, store: Store, fleet: SimFleet, node: SimNode,
    sim_users: tuple[str, ...],
) -> None:  # fmt: skip
    hidepid = fleet.hidepid
    me = sim_users[1]
    mine = node.spawn(gpu=0, mib=1000, user=me)
    theirs = node.spawn(gpu=1, mib=2000)  # root's
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert [n for n in snap.notes if "without sudo: fuser cannot see" in n]
    assert (snap.hidepid is not None) == hidepid
    assert bool([n for n in snap.notes if "mounted hidepid=" in n]) == hidepid
    (m,) = [p for p in snap.processes if p.pid == mine.pid]
    assert m.user == me and m.exists and m.holds_device_file
    (t,) = [p for p in snap.processes if p.pid == theirs.pid]
    assert t.used_memory_mib == 2000 and t.exists == (not hidepid)

    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    p = subprocess.run([sys.executable, "-m", "gpubot", "--config", str(fleet.config_path),
                        "status", "node1", "--json"], capture_output=True, text=True, env=env,
                       timeout=120)  # fmt: skip
    doc = json.loads(p.stdout)
    (n,) = doc.get("nodes", [doc])
    assert any(note.startswith("partial view") for note in n["notes"])

    sweep = SweepService(settings, load_sweep_config({"sweep": {"interval_s": 60}}),
                         engine.status, store, replica="test")  # fmt: skip
    assert (await sweep.run()).findings == ()  # nothing it cannot see becomes a zombie

    plan, before = await engine.plan(ResetRequest("node1", me, gpus=(0,)))
    r = await engine.execute(plan, actor="t", source="t", command="t", before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(mine.pid)

    plan, before = await engine.plan(ResetRequest("node1", me, gpus=(1,)))
    r = await engine.execute(plan, actor="t", source="t", command="t", before=before)
    (g,) = r.gpus
    assert g.outcome is not Outcome.FREED and alive(theirs.pid)  # never "freed" while it holds
    assert ("cannot signal it" in g.detail) if hidepid else ("kill failed" in g.detail)

    r = await engine.gpu_reset("node1", 2, actor="t", source="t", command="t")
    (g,) = r.gpus
    assert g.outcome is Outcome.UNKNOWN and "Insufficient Permissions" in g.detail
