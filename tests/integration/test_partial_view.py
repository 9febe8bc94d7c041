"""gpubot reaching a node as an ordinary account, with and without /proc mounted hidepid=2.

Without root, ``fuser`` cannot look into other users' processes ("Cannot stat file /proc/PID/fd/…:
Permission denied"), and with hidepid their /proc entries are not there at all. gpubot must say
its view is partial and never turn what it cannot see into a finding or a "freed".
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpubot.config import Settings
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, ResetService
from gpubot.services.sweep import SweepService
from gpubot.store import Store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import reset_fixtures, status_notes
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.procs import alive


@pytest.fixture(scope="module", params=[False, True], ids=["plain-proc", "hidepid"])
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sim_users: tuple[str, ...],
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("partial"),
        nodes=1,
        gpus=4,
        release_delay_s=0.3,
        view_user=sim_users[1],
        hidepid=request.param,
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures(grace_s=0.5, verify_timeout_s=3.0)


async def test_a_partial_view_is_said_and_never_taken_for_the_truth(
    engine: ResetService,
    settings: Settings,
    store: Store,
    fleet: SimFleet,
    node: SimNode,
    sim_users: tuple[str, ...],
) -> None:
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

    text, doc = status_notes(fleet.config_path, "node1")
    assert "partial view" in text
    assert any(note.startswith("partial view") for note in doc["notes"])

    sweep = SweepService(
        s := with_sweep(settings, interval_s=60),
        engine.status,
        engine.transport,
        sweep_ports(s, store),
        replica="test",
    )
    assert (await sweep.run()).findings == ()  # nothing it cannot see becomes a zombie

    plan, before = await engine.plan(ResetRequest("node1", me, gpus=(0,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(mine.pid)

    plan, before = await engine.plan(ResetRequest("node1", me, gpus=(1,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    (g,) = r.gpus
    assert g.outcome is not Outcome.FREED and alive(theirs.pid)  # never "freed" while it holds
    assert ("cannot signal it" in g.detail) if hidepid else ("kill failed" in g.detail)

    r = await engine.gpu_reset("node1", 2, Ask.by("t", "t", "t"))
    (g,) = r.gpus
    assert g.outcome is Outcome.UNKNOWN and "Insufficient Permissions" in g.detail
