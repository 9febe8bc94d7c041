"""A GPU handed over between two users' jobs: idle time is each holder's own (issue 34).

Mallory's job sits idle on GPU 3; bob's job arrives and loads data at 0 %; hers ends. The GPU's
idle run goes on, but bob was not there for most of it: his job is never named idle for longer
than it has held the GPU, and the reclaim ladder's evidence about it holds no sample from before
it came. The control: one long-lived idle job through the same sweeps is named idle for the
whole run. The idle accounting, the findings and the ladder run as a sweep wires them, over the
memory store and a virtual clock (no process, no socket, no sleep).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from gpubot.core.alerting import SweepResult
from gpubot.core.findings import IDLE_HOLDER, Finding, SweepConfig, find
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.protect import Protection
from gpubot.core.usage.holder_runs import look, on_gpu_since
from gpubot.core.usage.idle import IdleRule
from gpubot.core.usage.ladder import Evidence, LadderRule, Step
from gpubot.services.idle_accounting import IdleAccounting
from gpubot.services.ladder import ReclaimLadder
from gpubot.store import Store, open_store
from tests.fixtures.clock import VirtualClock

INTERVAL = 60.0
CFG = SweepConfig(interval_s=INTERVAL, idle=IdleRule(min_mib=4096, hours=0.25, keep_s=86400.0))
WINDOW = CFG.idle.window_s  # 15 min
MALLORY = (4242, 1_000, "mallory", 1001)
BOB = (5151, 90_000, "bob", 1002)
NOTEBOOK = (6262, 70_000, "carol", 1003)


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


def job(who: tuple[int, int, str, int], age_s: float) -> GpuProcess:
    pid, ticks, user, uid = who
    return GpuProcess(
        pid,
        3,
        8192,
        "python3",
        True,
        True,
        user=user,
        state="S",
        start_ticks=ticks,
        elapsed_s=int(age_s),
        uid=uid,
        real_uid=uid,
    )


def node(at: float, procs: Sequence[GpuProcess]) -> NodeSnapshot:
    used = sum(p.used_memory_mib or 0 for p in procs)
    gpu = GpuInfo(3, "GPU-3", "H100", used, 81559, 0, minor=3)  # 0 % throughout
    return NodeSnapshot("n1", at, (gpu,), tuple(procs))


class Box:
    """One node's GPU 3 over time: who holds it, swept every minute as the sweep does."""

    def __init__(self, store: Store, clock: VirtualClock) -> None:
        self.store = store
        self.clock = clock
        self.restart()
        self.born: dict[str, float] = {}

    def restart(self, *, keep_runs: bool = True) -> None:
        """Start the idle accounting and the ladder anew over the same store, as gpubot after a
        restart, a replica taking over or a CLI sweep does (``keep_runs`` False: the holder
        runs kept in the store are lost too, as when they were kept in memory only)."""
        self.idle = IdleAccounting(CFG, Protection(), self.store.samples, clock=self.clock)
        rule = LadderRule(True, remind_after_s=3600, post_after_s=3600, offer_after_s=3600)
        self.ladder = ReclaimLadder(rule, self.store.ladder, self.store.samples, clock=self.clock)
        if not keep_runs:
            with self.store.engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM gpu_holders")

    async def sweep(self, *holders: tuple[int, int, str, int]) -> list[Finding]:
        now = self.clock.now()
        for h in holders:
            self.born.setdefault(h[2], now - 1.0)  # each job came a second before this look
        snap = node(now, [job(h, now - self.born[h[2]]) for h in holders])
        times = await self.idle.sweep([snap], now)
        found = find(
            [snap], {}, CFG, protection=Protection(), idle=times.gpus, held=times.held, at=now
        )
        self.clock.t += INTERVAL
        return [f for f in found if f.kind is IDLE_HOLDER]


async def test_a_job_handed_an_idle_gpu_is_not_named_idle_for_the_time_before_it(
    store: Store,
) -> None:
    box = Box(store, VirtualClock())
    for _ in range(30):  # mallory's job idle for half an hour: named idle past 15 min
        mine = await box.sweep(MALLORY)
    assert [f.owner for f in mine] == ["mallory"]
    bob_came = box.clock.now() - 1.0
    for _ in range(3):  # bob's job arrives and loads data at 0 %, beside hers
        both = await box.sweep(MALLORY, BOB)
        assert [f.owner for f in both] == ["mallory"]
    found = await box.sweep(BOB)  # hers ends: the GPU's run goes on, bob's does not
    assert found == []  # the GPU has been idle 34 min; bob's job has not
    for _ in range(20):
        found = await box.sweep(BOB)
        for f in found:  # once named, never for longer than it has held the GPU
            assert f.idle_s is not None
            assert f.idle_s <= box.clock.now() - INTERVAL - bob_came
    (f,) = found
    assert f.idle_s is not None and f.idle_since is not None
    assert f.owner == "bob" and f.idle_since >= bob_came
    assert WINDOW <= f.idle_s < 25 * INTERVAL
    told = await box.ladder.climb(_result(box.clock.now(), found))
    (dm,) = told
    assert dm.step is Step.DM and dm.rung.owner == "bob"
    samples = await store.samples.samples_since(0.0, gpus=[("n1", 3)])
    assert len(samples) == 54  # the GPU's whole history is there ...
    ev = dm.evidence  # ... and bob's evidence is only his
    assert isinstance(ev, Evidence)
    assert ev.first_at is not None and ev.first_at >= bob_came
    assert ev.samples == sum(1 for s in samples if s.taken_at >= f.idle_since)
    assert ev.samples < sum(1 for s in samples if s.taken_at >= box.clock.now() - 34 * 60)


async def test_control_one_long_lived_idle_job_is_named_idle_for_the_whole_run(
    store: Store,
) -> None:
    box = Box(store, VirtualClock())
    start = box.clock.now()
    for _ in range(54):  # the same sweeps, one job all along
        found = await box.sweep(MALLORY)
    (f,) = found
    last = box.clock.now() - INTERVAL
    assert f.owner == "mallory" and f.idle_s == last - start
    (dm,) = await box.ladder.climb(_result(box.clock.now(), found))
    assert isinstance(dm.evidence, Evidence)
    assert dm.evidence.samples == 54 and dm.evidence.first_at == start


@pytest.mark.parametrize("keep_runs", [True, False])
async def test_after_a_restart_a_job_handed_an_idle_gpu_is_counted_from_its_arrival(
    store: Store, keep_runs: bool
) -> None:
    """Bob's job prepared data on the CPUs for 40 min, then came to mallory's idle GPU; gpubot
    restarts while both are there. The runs kept in the store still say when bob came. The
    control (``keep_runs`` False: the runs lost with the old process) names bob idle for the
    GPU's whole run, mallory's half hour included."""
    box = Box(store, VirtualClock())
    gpu_idle_from = box.clock.now()
    for _ in range(30):
        await box.sweep(MALLORY)
    box.born["bob"] = box.clock.now() - 40 * 60
    bob_came = box.clock.now()
    for _ in range(3):
        await box.sweep(MALLORY, BOB)
    box.restart(keep_runs=keep_runs)
    found = await box.sweep(BOB)  # hers ends: the GPU has been idle 33 min, bob's job 40
    if not keep_runs:  # the attack succeeds: bob is named idle with mallory's time
        (f,) = found
        assert f.owner == "bob" and f.idle_since == gpu_idle_from
        assert f.idle_s is not None and f.idle_s > 30 * INTERVAL
        return
    assert found == []
    for _ in range(20):
        found = await box.sweep(BOB)
        for f in found:
            assert f.idle_s is not None and f.idle_s <= box.clock.now() - INTERVAL - bob_came
    (f,) = found
    assert f.owner == "bob" and f.idle_since == bob_came
    (dm,) = await box.ladder.climb(_result(box.clock.now(), found))
    assert isinstance(dm.evidence, Evidence)
    assert dm.rung.owner == "bob" and dm.evidence.first_at == bob_came


@pytest.mark.parametrize("keep_runs", [True, False])
async def test_after_a_restart_a_notebook_that_took_an_idle_gpu_is_not_told_to_free_it(
    store: Store, keep_runs: bool
) -> None:
    """A notebook kernel started 10 h ago takes over mallory's GPU, idle for an hour, 3 min
    ago; then gpubot restarts (or a replica, or the Home tab's look, reads the fleet). Neither
    the sweep nor the GPU-hours name the notebook's owner. The control (``keep_runs`` False)
    DMs carol with the hour that was mallory's."""
    box = Box(store, VirtualClock())
    for _ in range(60):
        await box.sweep(MALLORY)
    box.born["carol"] = box.clock.now() - 10 * 3600
    for _ in range(3):
        await box.sweep(NOTEBOOK)
    box.restart(keep_runs=keep_runs)
    snap = node(box.clock.now(), [job(NOTEBOOK, box.clock.now() - box.born["carol"])])
    hours = await box.idle.gpu_hours([snap])  # a look that stores nothing
    found = await box.sweep(NOTEBOOK)
    told = await box.ladder.climb(_result(box.clock.now(), found))
    if keep_runs:
        assert hours == {} and found == [] and told == []
        return
    assert hours == {"carol": pytest.approx(1.05, abs=0.01)}  # 63 min, none of them hers
    (dm,) = told
    assert dm.step is Step.DM and dm.rung.owner == "carol"


def test_control_without_the_holders_runs_the_new_job_inherits_the_gpu_run() -> None:
    """The attack succeeds when the holder's own run is not asked: the GPU's run is bob's."""
    t0 = 1_700_000_000.0
    snap = node(t0 + 34 * 60, [job(BOB, 4.0)])
    idle = {("n1", 3): 34 * 60.0}
    everyone_since_ever = {("n1", 3, f"{BOB[0]}:{BOB[1]}"): 0.0}
    (f,) = find([snap], {}, CFG, idle=idle, held=everyone_since_ever)
    assert f.owner == "bob" and f.idle_s == 34 * 60.0
    assert find([snap], {}, CFG, idle=idle) == ()  # bounded by its own start: 4 s


def test_a_holder_first_seen_on_a_watched_gpu_starts_its_run_at_that_look() -> None:
    """A long-lived process (a notebook started days ago) that comes to a GPU gpubot watches is
    counted from the look that first saw it there, not from its own start."""
    t0 = 1_700_000_000.0
    runs = look({}, [node(t0, [job(MALLORY, 5.0)])], t0, 90.0)
    old = job(BOB, 3 * 86400.0)
    runs = look(runs, [node(t0 + 60, [job(MALLORY, 65.0), old])], t0 + 60, 90.0)
    since = on_gpu_since(runs)
    assert since[("n1", 3, "5151:90000")] == t0 + 60
    assert since[("n1", 3, "4242:1000")] == t0 - 5.0  # first look: its own start
    later = look(runs, [node(t0 + 300, [old])], t0 + 300, 90.0)  # a gap: nobody looked
    assert on_gpu_since(later)[("n1", 3, "5151:90000")] == t0 + 300 - 3 * 86400.0


def _result(at: float, found: Sequence[Finding]) -> SweepResult:
    return SweepResult(at, 0.1, ("n1",), (node(at, []),), {}, (), tuple(found))
