"""Hung-but-busy holders found by sweeps of the simulated fleet over real SSH (issue 37).

A wedged job runs at 100 % but draws little (``gpusim.health_faults.set_workload(power_w=)``),
its memory flat; a busy job draws what 100 % draws; a job loading data is at 100 % and draws
little too, but its memory grows sweep by sweep. The sweep is the real composition's, with the
health checks as ``gpubot.app`` wires them; the store a real SQLite database; Slack the loopback
fake of the Web API; time moves by a clock the test holds (a sweep a minute).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.core.findings import Finding
from gpusim import health_faults as hf
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.health_sweep import (
    buttons,
    posts,
    settings_for,
    sweep,
    sweeper,
    text_of,
)
from tests.fixtures.settings import ManualClock
from tests.fixtures.slack import FakeSlack

WEDGED_W = 20.0  # the job's share: the GPU draws 70 + 20 = 90 W of its 700 W limit


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("hung"), nodes=1, gpus=4, people=("alice", "bob")) as f:
        yield f


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        n.clear()


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("sqlite", tmp_path) as url:
        yield url


def hung(findings: tuple[Finding, ...]) -> list[tuple[int | None, str | None, int | None]]:
    return [(f.gpu, f.owner, f.pid) for f in findings if f.kind.value == "hung-busy"]


async def test_a_wedged_job_is_one_finding_for_its_owner_a_busy_or_loading_one_none(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    wedged = n1.spawn(gpu=0, mib=30000, util_pct=100, user="alice")
    hf.set_workload(n1, wedged, power_w=WEDGED_W)
    n1.spawn(gpu=1, mib=30000, util_pct=100, user="bob")  # busy, drawing 670 W: control
    loading = n1.spawn(gpu=2, mib=8000, util_pct=100, user="bob")
    hf.set_workload(n1, loading, power_w=WEDGED_W)  # input-bound: low power, but it grows
    clock = ManualClock()
    seen = []
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        for i in range(5):
            hf.set_workload(n1, loading, mib=8000 + 3000 * (i + 1))
            result = await sweep(svc, clock)
            seen.append(hung(result.findings))
            if i == 3:
                alerted = [(k.gpu, k.kind) for k in result.alerted]
    assert seen == [[], [], [(0, "alice", wedged.pid)]] + [[(0, "alice", wedged.pid)]] * 2
    assert alerted == [(0, "hung-busy")]  # confirmed by a second sweep, alerted once
    (alert,) = posts(fake_slack)
    text = text_of(alert)
    assert "GPU busy without progress" in text and "alice" in text
    for said in ("4 looks in a row", "100 % utilisation", "at most 90 W", "under 245 W"):
        assert said in text
    assert "30000 MiB unchanged" in text and "(3 min)" in text  # a sweep a minute
    assert not [b for b in buttons(alert) if b[0] == "gpubot_reset_gpu"]  # no kill offered yet


async def test_users_in_turn_on_one_gpu_are_each_judged_on_their_own_time(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    first = n1.spawn(gpu=3, mib=30000, util_pct=100, user="alice")
    hf.set_workload(n1, first, power_w=WEDGED_W)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, db_url), fake_slack, clock) as svc:
        assert [hung((await sweep(svc, clock)).findings) for _ in range(2)] == [[], []]
        n1.kill_workloads()  # alice's ends before her third look; bob's takes the GPU, wedged
        then = n1.spawn(gpu=3, mib=30000, util_pct=100, user="bob")
        hf.set_workload(n1, then, power_w=WEDGED_W)
        later = [hung((await sweep(svc, clock)).findings) for _ in range(3)]
    # the GPU was wedged five sweeps in a row, but bob's job only for its own three
    assert later == [[], [], [(3, "bob", then.pid)]]
