"""Incremental idle runs against the raw sample history, on SQLite and PostgreSQL.

Generated fleets of sweeps (missed sweeps, the bot down, busy and unknown blips, too little
memory, a node restarted with another card, two sweeps overlapping, a rule changed) go through
``IdleAccounting.sweep`` (the runs) while the old path (``benchmarks.idle_old``: every idle
GPU's history reread) answers from the same samples. The idle GPUs, their idle seconds, the
idle-holder findings and the GPU-hours must be the same at every sweep.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import sqlalchemy as sa

from benchmarks.idle_old import old_idle
from gpubot.core.alerting import held_idle_hours
from gpubot.core.findings import IDLE_HOLDER, SweepConfig, find
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.protect import Protection
from gpubot.core.usage.idle import IdleRule
from gpubot.services import idle_accounting
from gpubot.services.idle_accounting import IdleAccounting
from gpubot.store import Store
from tests.fixtures.settings import ManualClock

H = 3600.0
T0 = 1_900_000_000.0
INTERVAL = 900.0
CFG = SweepConfig(interval_s=INTERVAL, idle=IdleRule(min_mib=4096, hours=1.0, keep_s=3 * H))
NODES = ("n1", "n2", "n3")
GPUS = 2


def holder(g: int, mem: int | None) -> GpuProcess:
    return GpuProcess(
        100 + g,
        g,
        mem,
        "python3",
        True,
        True,
        user=f"u{g}",
        state="S",
        start_ticks=7,
        uid=1000 + g,
        real_uid=1000 + g,
    )


def snapshot(
    rng: random.Random, node: str, at: float, cards: dict[tuple[str, int], str]
) -> NodeSnapshot:
    gpus, procs = [], []
    for g in range(GPUS):
        util = rng.choice([0] * 14 + [40, None])  # busy or unknown blips
        mem = rng.choice([8192] * 10 + [2048, None])  # too little to hoard, unknown
        gpus.append(GpuInfo(g, cards[(node, g)], "H200", mem, 143771, util, minor=g))
        procs.append(holder(g, mem))
    return NodeSnapshot(node, at, tuple(gpus), tuple(procs))


async def compare_one_history(store: Store, seed: int, steps: int) -> int:
    """Run one generated history through both paths; return how many idle answers were seen."""
    rng = random.Random(seed)
    clock = ManualClock(T0)
    acct = IdleAccounting(CFG, Protection(), store.samples, clock=clock)
    cards = {(n, g): f"GPU-{n}-{g}" for n in NODES for g in range(GPUS)}
    t, seen = T0, 0
    for step in range(steps):
        t += rng.choice([INTERVAL] * 8 + [INTERVAL * 2, INTERVAL * 1.5, INTERVAL * 6, 0.0])
        at = t - rng.choice([0.0] * 12 + [120.0])  # now and then a sweep that started earlier
        if rng.random() < 0.05:  # a node restarted: its GPU 0 answers with another card
            n = rng.choice(NODES)
            cards[(n, 0)] = f"{cards[(n, 0)]}x"
        if step == steps // 2:  # the settings changed: every run is rebuilt, once
            acct.config = replace(CFG, idle=replace(CFG.idle, min_mib=6144))
        snaps = [snapshot(rng, n, at, cards) for n in NODES if rng.random() > 0.1]
        want = await old_idle(store.samples, acct.config, snaps, at)
        got = (await acct.sweep(snaps, at)).gpus
        assert got == want, (seed, step)
        protection = acct.protection
        assert find(snaps, {}, acct.config, protection=protection, idle=got) == find(
            snaps, {}, acct.config, protection=protection, idle=want
        )
        # a status a little later: the GPU-hours read the runs without writing
        clock.t = at + 60.0
        status = [replace(s, taken_at=clock.t) for s in snaps]
        raw = await old_idle(store.samples, acct.config, status, clock.t)
        held = await acct.held(status, clock.t)  # the holders' own runs (core.usage.holder_runs)
        found = find(status, {}, acct.config, protection=protection, idle=raw, held=held)
        assert await acct.gpu_hours(status) == held_idle_hours(found), (seed, step)
        seen += sum(1 for f in found if f.kind is IDLE_HOLDER)
    return seen


def clear(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM gpu_samples")
        conn.exec_driver_sql("DELETE FROM gpu_idle")
        conn.exec_driver_sql("DELETE FROM gpu_holders")


@pytest.mark.timeout(300)
async def test_the_runs_answer_as_the_history_does(store: Store) -> None:
    seen = 0
    for seed in range(6):
        clear(store)
        seen += await compare_one_history(store, seed, 60)
    assert seen > 20  # the histories do hold idle GPUs long enough to count


async def test_bounded_pruning_changes_no_answer(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idle_accounting, "PRUNE_BATCH", 3)  # far less than a sweep adds
    assert await compare_one_history(store, 0, 40) > 0
    with store.engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM gpu_samples")).scalar()
    assert left is not None and left > 3 * 40  # the backlog is pruned a batch at a time


async def test_the_first_sweep_after_the_upgrade_rebuilds_from_the_samples(store: Store) -> None:
    """0006 starts with no runs: the samples already kept say since when."""
    clock = ManualClock(T0)
    acct = IdleAccounting(CFG, Protection(), store.samples, clock=clock)
    cards = {(n, g): f"GPU-{n}-{g}" for n in NODES for g in range(GPUS)}
    idle = [
        NodeSnapshot(
            "n1", 0.0, (GpuInfo(0, cards[("n1", 0)], "H200", 8192, 143771, 0),), (holder(0, 8192),)
        )
    ]
    from gpubot.core.usage.idle import samples_of

    for i in range(6):  # 0005's sweeps: samples only
        await store.samples.add_samples(samples_of(idle, T0 + i * INTERVAL))
    at = T0 + 6 * INTERVAL
    assert (await acct.sweep(idle, at)).gpus == {("n1", 0): 6 * INTERVAL}
    assert (await acct.sweep(idle, at + INTERVAL)).gpus == {("n1", 0): 7 * INTERVAL}


async def test_a_run_longer_than_the_samples_kept_counts_from_the_first_kept(
    store: Store,
) -> None:
    clock = ManualClock(T0)
    acct = IdleAccounting(CFG, Protection(), store.samples, clock=clock)
    gpu = GpuInfo(0, "GPU-n1-0", "H200", 8192, 143771, 0)
    snaps = [NodeSnapshot("n1", 0.0, (gpu,), (holder(0, 8192),))]
    for i in range(24):  # 6 h held idle, 3 h kept
        at = T0 + i * INTERVAL + 0.25
        want = await old_idle(store.samples, CFG, snaps, at)
        assert (await acct.sweep(snaps, at)).gpus == want
    assert want == {("n1", 0): 3 * H}  # the first sample kept is exactly 3 h old


async def test_a_long_history_is_rebuilt_a_bounded_batch_a_sweep(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the upgrade, a GPU whose run is not rebuilt yet is not idle (unknown is not idle);
    a few sweeps later every answer is the history's again."""
    from gpubot.core.usage.idle import samples_of
    from gpubot.store import idle_runs

    monkeypatch.setattr(idle_runs, "REBUILD_ROWS", 10)
    gpus = tuple(GpuInfo(g, f"GPU-n1-{g}", "H200", 8192, 143771, 0) for g in range(4))
    snaps = [NodeSnapshot("n1", 0.0, gpus, tuple(holder(g, 8192) for g in range(4)))]
    for i in range(8):  # 0005's sweeps: 2 h held idle, 8 samples a GPU
        await store.samples.add_samples(samples_of(snaps, T0 + i * INTERVAL))
    acct = IdleAccounting(CFG, Protection(), store.samples, clock=ManualClock(T0))
    answers = []
    for k in range(8, 14):
        at = T0 + k * INTERVAL
        want = await old_idle(store.samples, CFG, snaps, at)
        got = (await acct.sweep(snaps, at)).gpus
        assert set(got) <= set(want) and all(got[g] == want[g] for g in got)
        answers.append(len(got))
    assert answers[0] < 4 and answers[-1] == 4, answers
