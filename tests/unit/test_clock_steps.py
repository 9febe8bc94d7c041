"""Steps of the wall clock (issue 34): duties keep their interval on the monotonic clock, a step
is logged once, a forward step lasting seconds ends no claim, and a sample from the future is
never a GPU-hours baseline. A virtual clock steps its wall time; nothing sleeps for real."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpubot.config import Settings, load
from gpubot.core.claims.rules import ClaimRequest, ClaimSettings, Granted
from gpubot.core.clock import SETTLE_S, Steps, steps_of
from gpubot.core.models import CommandResult
from gpubot.core.usage.hours import GpuState, UsageSweep, hour_of, tally, weight_ms
from gpubot.core.usage.hours import SweepSample as Sample
from gpubot.core.usage.report import Window
from gpubot.scheduler import IntervalScheduler
from gpubot.services.claims import ClaimService, Ended, Event
from gpubot.services.status import StatusService
from gpubot.services.usage import UsageService
from gpubot.store import Store, open_store
from gpubot.transport.scripted import Call, ScriptedTransport
from tests.fixtures.clock import VirtualClock

H = 3600.0
STEP_LOG = "the wall clock stepped"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n\n'
        "[sweep]\ninterval_s = 60\nbudget_s = 30\n\n"
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'
    )
    return load(path)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    s = open_store(settings.database_url, check_schema=False)
    s.upgrade()
    yield s
    s.close()


def _steps(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(STEP_LOG)]


# -- the one watch -------------------------------------------------------------------------


async def test_a_step_is_seen_once_whoever_looks(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    steps = steps_of(clock)
    assert steps is steps_of(clock)  # one per clock: every duty shares it
    assert steps.check() is None
    await clock.advance(30)
    assert steps.check() is None  # time passing is no step
    clock.step(-H)
    jump = steps.check()
    assert jump is not None and round(jump) == -H
    assert steps.check() is None and steps.expiry_now() == clock.now()  # seen once
    assert _steps(caplog) == ["the wall clock stepped back by 3600 s: " + _rest()]


def _rest() -> str:
    return (
        "periodic duties keep their interval; claims, holds and approvals end only when the "
        "monotonic clock agrees"
    )


async def test_expiry_follows_a_forward_step_only_once_it_has_held() -> None:
    clock = VirtualClock()
    steps = Steps(clock)
    before = steps.expiry_now()
    clock.step(2 * H)
    await clock.advance(8)
    assert steps.expiry_now() == before + 8  # a step of 8 s so far: not trusted
    clock.step(-2 * H)  # corrected
    await clock.advance(4)
    assert steps.expiry_now() == clock.now() == before + 12
    clock.step(2 * H)  # a step that stays (a real correction, a resumed VM)
    await clock.advance(10)
    assert steps.expiry_now() == before + 22
    await clock.advance(SETTLE_S)
    assert steps.expiry_now() == clock.now()  # it held: trusted, late by SETTLE_S at most


# -- the scheduler ---------------------------------------------------------------------------


class WallSchedule:
    """The control: a schedule kept in wall time, as APScheduler 3 keeps it (next run = the
    last one's wall time plus the interval; it runs once the wall clock reaches it)."""

    def __init__(self, clock: VirtualClock, every_s: float) -> None:
        self.clock, self.every_s, self.runs = clock, every_s, 0
        self.next = clock.now()

    async def poll(self) -> None:
        if self.clock.now() >= self.next:
            self.runs += 1
            self.next += self.every_s


async def test_a_step_back_keeps_every_duty_on_its_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    runs = {"sweep": 0, "claims": 0}

    def job(name: str) -> IntervalScheduler:
        async def run() -> None:
            runs[name] += 1

        return IntervalScheduler(run, 60, first_after_s=0, name=name, clock=clock)

    sweep, claims = job("sweep"), job("claims")
    control = WallSchedule(clock, 60)
    poller = IntervalScheduler(control.poll, 1, first_after_s=0, name="poll", clock=clock)
    for s in (sweep, claims, poller):
        s.start()
    try:
        await clock.advance(150)  # runs at 0, 60, 120
        assert runs == {"sweep": 3, "claims": 3} and control.runs == 3
        clock.step(-H)  # NTP steps the wall clock back an hour
        await clock.advance(600)  # ten more intervals
        assert runs == {"sweep": 13, "claims": 13}
        assert control.runs == 3  # the wall-clock schedule has stopped for the hour
        assert len(_steps(caplog)) == 1  # three duties looked: logged once
    finally:
        for s in (sweep, claims, poller):
            await s.stop()
    assert not sweep.running and not claims.running


async def test_runs_missed_by_a_long_run_fold_into_the_next_interval() -> None:
    clock = VirtualClock()
    starts: list[float] = []

    async def slow() -> None:
        starts.append(clock.monotonic())
        if len(starts) == 1:
            await clock.sleep(150)  # the first run takes two and a half intervals

    s = IntervalScheduler(slow, 60, first_after_s=0, clock=clock)
    s.start()
    try:
        await clock.advance(250)
    finally:
        await s.stop()
    assert starts == [0.0, 180.0, 240.0]


# -- claims --------------------------------------------------------------------------------


def _ended(events: list[Event]) -> list[str]:
    return [e.claim.user for e in events if isinstance(e, Ended) and e.claim is not None]


def _no_node(call: Call) -> CommandResult:
    raise AssertionError(f"no node is asked here: {call.argv}")


async def _claim_service(settings: Settings, store: Store, clock: VirtualClock) -> ClaimService:
    claims = ClaimSettings(enabled=True, claim_idle_minutes=0)
    s = dataclasses.replace(settings, claims=claims)
    status = StatusService(s, ScriptedTransport(_no_node), store)
    svc = ClaimService(s, store.claims, status, clock=clock)
    now = clock.now()
    got = await store.claims.claim(
        ClaimRequest("node3", ((0, "GPU-0"),), "bob", "U0BOB", now, now + H, "", "cli")
    )
    assert isinstance(got, Granted)
    return svc


async def test_a_forward_step_of_seconds_ends_no_claim(settings: Settings, store: Store) -> None:
    clock = VirtualClock()
    svc = await _claim_service(settings, store, clock)
    assert await svc.tick() == []
    await clock.advance(60)
    clock.step(2 * H)  # a bad time source: two hours ahead, for 8 s
    await clock.advance(8)
    assert await svc.tick() == []  # the claim has 59 min left by the monotonic clock
    clock.step(-2 * H)
    await clock.advance(60)
    assert await svc.tick() == []
    assert [c.user for c in await store.claims.active()] == ["bob"]  # it stayed
    await clock.advance(H)
    assert _ended(await svc.tick()) == ["bob"]  # ends on time


async def test_control_the_wall_clock_alone_ends_it(settings: Settings, store: Store) -> None:
    clock = VirtualClock()
    svc = await _claim_service(settings, store, clock)
    steps_of(clock).settle_s = 0.0  # the defence out: a step is trusted at once
    await svc.tick()
    clock.step(2 * H)
    await clock.advance(8)
    assert _ended(await svc.tick()) == ["bob"]  # ended, 1 h early
    clock.step(-2 * H)
    assert await store.claims.active() == []  # and it stays ended


# -- GPU-hours -------------------------------------------------------------------------------


def test_a_sample_from_the_future_is_no_baseline() -> None:
    state = (GpuState("node3", 0, 50, ("bob",)),)
    t = 1_900_000_000.0
    ahead = Sample(t, state, {("node3", 0): t + 2 * H}, {"node3": t + 2 * H}, interval_s=60)
    out = tally(ahead)
    assert out.rows[(hour_of(t), "node3", 0, "bob")].busy == 60_000  # one interval, not 0
    assert [(g.start, g.end) for g in out.gaps] == [(t - 60, t)]  # and named
    # The control: a sweep overlapping the one before (by less than an interval) adds nothing.
    assert weight_ms(t + 30, t, 60) == 0


async def test_a_forward_step_corrected_names_its_gap(settings: Settings, store: Store) -> None:
    clock = VirtualClock(start=1_900_000_000.0 - 1_900_000_000.0 % H + 600)
    t0 = clock.now()
    state = (GpuState("node3", 0, 50, ("bob",)),)
    for at in (t0, t0 + 60, t0 + 2 * H + 120, t0 + 180, t0 + 240):  # stepped, then corrected
        await store.usage.add_sweep(UsageSweep(at, state, interval_s=60))
    await clock.advance(240)
    svc = UsageService(settings, store.usage, clock=clock)
    window = Window(int(hour_of(t0)), int(hour_of(t0) + 3 * H))
    report = await svc.report_of(window, "node", clock.now())
    rec = await store.usage.records(window.since, window.until)
    assert max(rec.last_seen.values()) == t0 + 240  # no sample in the future is kept
    assert sum(u.busy for u in rec.rows if u.user == "") == 5 * 60_000  # each one interval
    assert "node3: " in report.text() and "data missing in 2 stretch(es)" in report.text()
    gaps = [(g.start - t0, None if g.end is None else g.end - t0) for g in report.coverage.gaps]
    assert gaps == [(60.0, 2 * H + 120), (120.0, 180.0)]  # the step, and its correction
