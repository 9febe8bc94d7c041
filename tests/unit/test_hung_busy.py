"""Hung-but-busy holders (pure: ``core.health.hung``): a job at 100 % that draws little and whose
memory does not move, judged per process over N looks; the sweep over real SSH on the simulated
fleet is tests/integration/test_sweep_hung.py."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from gpubot.chat.ladder import ACTION_ONCALL_FREE, render_ladder
from gpubot.core.alerting import SweepResult
from gpubot.core.findings import IDLE_HOLDER, Finding
from gpubot.core.health.findings import HealthMemory, find_health
from gpubot.core.health.hung import HUNG_BUSY, HungMemory, HungRule, find_hung, low_line
from gpubot.core.health.state import GpuHealth, NodeHealth
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.ladder import BusyEvidence, LadderRule, Step
from gpubot.services.ladder import LadderNotice, ReclaimLadder
from gpubot.slack.render import to_slack
from gpubot.store import open_store
from tests.fixtures.clock import VirtualClock

RULE = HungRule(sweeps=3, max_gap_s=90.0)
LIMIT = 700.0  # fallback line: 0.35 x 700 = 245 W
LOW, NORMAL = 90.0, 620.0


def job(pid: int, mib: int, *, user: str = "ana", ticks: int | None = None) -> GpuProcess:
    return GpuProcess(pid, 0, mib, "python3", True, True, user=user, start_ticks=ticks or pid)


def look(
    at: float, procs: Sequence[GpuProcess], *, util: int = 100, watts: float = LOW
) -> tuple[NodeSnapshot, NodeHealth]:
    snap = NodeSnapshot("n", at, (GpuInfo(0, "GPU-0", "H100", 30000, 81559, util),), tuple(procs))
    return snap, NodeHealth({0: GpuHealth(0, power_w=watts, power_limit_w=LIMIT)})


def run(
    looks: Sequence[tuple[NodeSnapshot, NodeHealth]], memory: HungMemory | None = None
) -> tuple[list[list[Finding]], HungMemory]:
    mem = memory or HungMemory()
    seen = []
    for snap, nh in looks:
        found, mem = find_hung([snap], {"n": nh}, mem, RULE)
        seen.append(list(found))
    return seen, mem


def holders(seen: list[list[Finding]]) -> list[list[str]]:
    return [[f.holder for f in found] for found in seen]


def test_busy_low_power_flat_memory_for_n_looks_is_one_finding_for_its_owner() -> None:
    seen, _ = run([look(60.0 * i, [job(7, 30000)]) for i in range(4)])
    assert holders(seen) == [[], [], ["7:7"], ["7:7"]]  # the third look, then it stands
    f = seen[2][0]
    assert f.kind is HUNG_BUSY and f.owner == "ana" and (f.node, f.gpu, f.pid) == ("n", 0, 7)
    for said in ("3 looks in a row", "100 % utilisation", "at most 90 W", "under 245 W"):
        assert said in f.summary
    assert "0.35 × its 700 W limit" in f.summary and "30000 MiB unchanged" in f.summary


def test_normal_power_is_never_hung() -> None:  # control: the same job, drawing what it should
    seen, _ = run([look(60.0 * i, [job(7, 30000)], watts=NORMAL) for i in range(6)])
    assert holders(seen) == [[]] * 6


def test_a_job_loading_data_is_not_hung_and_its_run_restarts() -> None:
    # 100 % and low power (input-bound), but its memory grows: not wedged
    mibs = [10000, 14000, 18000, 22000, 22000, 22000]
    seen, _ = run([look(60.0 * i, [job(7, m)]) for i, m in enumerate(mibs)])
    assert holders(seen) == [[], [], [], [], [], ["7:7"]]  # flat from the 4th look: 3 looks on
    small = [30000, 30010, 30040, 30000]  # within the tolerance: still flat
    seen, _ = run([look(60.0 * i, [job(7, m)]) for i, m in enumerate(small)])
    assert holders(seen)[2:] == [["7:7"], ["7:7"]]


def test_below_busy_utilisation_is_not_hung() -> None:
    seen, _ = run([look(60.0 * i, [job(7, 30000)], util=94) for i in range(5)])
    assert holders(seen) == [[]] * 5
    seen, _ = run([look(60.0 * i, [job(7, 30000)], util=95) for i in range(3)])
    assert holders(seen)[-1] == ["7:7"]  # control: at the line


def test_two_users_in_turn_each_judged_on_their_own_time() -> None:
    ana, bob = job(7, 30000, user="ana"), job(8, 30000, user="bob")
    looks = [look(0.0, [ana]), look(60.0, [ana]), look(120.0, [ana])]  # ana hangs, then ends
    looks += [look(180.0, [bob]), look(240.0, [bob]), look(300.0, [bob])]  # bob's wedges too
    seen, _ = run(looks)
    assert holders(seen) == [[], [], ["7:7"], [], [], ["8:8"]]
    assert seen[2][0].owner == "ana" and seen[5][0].owner == "bob"
    assert "since 1970-01-01 00:03 UTC" in seen[5][0].summary  # bob's own first look, not ana's


def test_a_same_pid_reused_is_another_process() -> None:
    first, again = job(7, 30000, ticks=100), job(7, 30000, ticks=555)  # pid reused
    seen, _ = run([look(0.0, [first]), look(60.0, [first]), look(120.0, [again])])
    assert holders(seen) == [[], [], []]


def test_a_gap_between_looks_starts_the_run_again() -> None:
    seen, _ = run([look(t, [job(7, 30000)]) for t in (0.0, 60.0, 300.0, 360.0, 420.0)])
    assert holders(seen) == [[], [], [], [], ["7:7"]]  # 300 - 60 > 90: a run from 300


def test_unknown_is_not_hung() -> None:
    nolimit = NodeHealth({0: GpuHealth(0, power_w=LOW)})  # no limit said, nothing learned
    snap = look(0.0, [job(7, 30000)])[0]
    mem = HungMemory()
    for t in (0.0, 60.0, 120.0):
        found, mem = find_hung(
            [NodeSnapshot("n", t, snap.gpus, snap.processes)], {"n": nolimit}, mem, RULE
        )
        assert found == ()
    hidden = GpuProcess(9, 0, None, "python3", False, True, user="ana", start_ticks=9)
    seen, _ = run([look(60.0 * i, [hidden]) for i in range(4)])  # its memory unknown
    assert holders(seen) == [[]] * 4


def test_the_line_is_learned_per_model_once_enough_readings() -> None:
    mem = HungMemory(draws={"H100": (300.0,) * (RULE.learn_min - 1)})
    assert low_line("H100", LIMIT, mem, RULE).watts == pytest.approx(245.0)  # type: ignore[union-attr]
    mem = HungMemory(draws={"H100": (300.0,) * RULE.learn_min})
    line = low_line("H100", LIMIT, mem, RULE)
    assert line is not None and line.watts == pytest.approx(150.0) and "median 300 W" in line.why
    # a model whose busy draw is 300 W: 200 W is not "far below" it, though it is under 245 W
    seen, _ = run([look(60.0 * i, [job(7, 30000)], watts=200.0) for i in range(4)], mem)
    assert holders(seen) == [[]] * 4
    seen, after = run([look(60.0 * i, [job(7, 30000)], watts=200.0) for i in range(4)])
    assert holders(seen)[-1] == ["7:7"]  # control: not learned yet, the limit's line
    assert "H100" not in after.draws  # a reading under the line is never learned as typical
    _, after = run([look(60.0 * i, [job(7, 30000)], watts=w) for i, w in enumerate([600, 640])])
    assert after.draws["H100"] == (600.0, 640.0)  # busy readings are learned, newest last
    assert low_line("A100", None, after, RULE) is None  # another model learns on its own


def test_a_long_wedge_is_not_learned_as_the_typical_draw() -> None:
    seen, mem = run([look(60.0 * i, [job(7, 30000)]) for i in range(3 * RULE.learn_min)])
    assert all(found for found in seen[2:])  # found on every look from the third, for an hour
    assert mem.draws == {}


def test_off_finds_nothing_and_the_health_sweep_carries_it() -> None:
    looks = [look(60.0 * i, [job(7, 30000)]) for i in range(3)]
    off = HungRule(sweeps=0)
    assert all(find_hung([s], {"n": h}, HungMemory(), off)[0] == () for s, h in looks)
    mem = HealthMemory()
    kinds = []
    for snap, nh in looks:
        found, mem = find_health([snap], {"n": nh}, mem, hung=RULE)
        kinds.append([f.kind.value for f in found])
    assert kinds == [[], [], ["hung-busy"]]


class Told:
    """A ladder notifier that keeps what it was asked to tell."""

    def __init__(self) -> None:
        self.notices: list[LadderNotice] = []

    async def tell(self, notice: LadderNotice) -> bool:
        self.notices.append(notice)
        return True


async def test_a_hung_holder_climbs_the_ladder_its_owner_told_before_on_call() -> None:
    store = open_store("memory://")
    clock = VirtualClock()
    told = Told()
    rule = LadderRule(True, remind_after_s=600, post_after_s=600, offer_after_s=600)
    ladder = ReclaimLadder(rule, store.ladder, store.samples, told, clock=clock)
    mem = HungMemory()
    steps = []
    try:
        for _ in range(40):  # a look a minute
            snap, nh = look(clock.now(), [job(7, 30000)])
            found, mem = find_hung([snap], {"n": nh}, mem, RULE, at=clock.now())
            res = SweepResult(clock.now(), 0.1, ("n",), (snap,), {}, (), found)
            steps += [(n.step, n.rung.owner) for n in await ladder.climb(res)]
            clock.t += 60.0
        assert steps == [(s, "ana") for s in (Step.DM, Step.REMIND, Step.POST, Step.OFFER)]
        dm, offer = told.notices[0], told.notices[-1]
        assert isinstance(dm.evidence, BusyEvidence) and "90 W" in dm.evidence.text()
        dm_text = json.dumps(to_slack(render_ladder(dm, ["U0ANA"]))["blocks"], ensure_ascii=False)
        assert "looks hung: busy, but no progress" in dm_text and "held idle" not in dm_text
        offer_text = json.dumps(to_slack(render_ladder(offer, []))["blocks"], ensure_ascii=False)
        assert "Looks hung in the job of" in offer_text and ACTION_ONCALL_FREE in offer_text
        # it is no longer hung (its memory moved): it leaves the ladder
        snap, nh = look(clock.now(), [job(7, 40000)])
        found, mem = find_hung([snap], {"n": nh}, mem, RULE, at=clock.now())
        await ladder.climb(SweepResult(clock.now(), 0.1, ("n",), (snap,), {}, (), found))
        assert found == () and await store.ladder.rungs() == {}
    finally:
        store.close()


async def test_with_the_ladder_on_a_hung_holder_is_not_also_a_plain_alert() -> None:
    assert HUNG_BUSY.ladder and IDLE_HOLDER.ladder
    assert not HUNG_BUSY.reset  # the plain alert (ladder off) offers no forced kill at once
