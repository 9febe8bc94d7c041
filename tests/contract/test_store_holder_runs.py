"""Holder runs kept in the store (``gpu_holders``), on SQLite in memory, SQLite and PostgreSQL.

Since when each process has held its GPU is folded in the sweep's transaction and read by every
process over the same database: two stores (the bot and a replica, or the bot after a restart,
or the CLI) sweeping in turn answer as one in-memory fold of the same looks
(``usage.holder_runs.look``); a status's look writes nothing; a holder gone from its GPU, a node
not looked at for longer than the gap and a node gone from the fleet leave no row.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.holder_runs import HolderKey, Looked, OnGpu, look, on_gpu_since
from gpubot.core.usage.idle import samples_of
from gpubot.core.usage.idle_runs import RunRule
from gpubot.store import Store, holder_runs, open_store
from gpubot.store.records import text_of

T0 = 1_900_000_000.0
INTERVAL = 900.0
GAP = 1.5 * INTERVAL
RULE = RunRule.of(4096, GAP)
NODES = ("n1", "n2")


@pytest.fixture
def replica(fresh_db_url: str, store: Store) -> Iterator[Store]:
    """A second store over the test's database: another gpubot process."""
    s = open_store(fresh_db_url)
    try:
        yield s
    finally:
        s.close()


def proc(pid: int, gpu: int, age_s: float | None) -> GpuProcess:
    return GpuProcess(
        pid,
        gpu,
        8192,
        "python3",
        True,
        True,
        user=f"u{pid}",
        state="S",
        start_ticks=pid * 10,
        elapsed_s=None if age_s is None else int(age_s),
        uid=1000,
        real_uid=1000,
    )


def snap(node: str, at: float, procs: tuple[GpuProcess, ...], gpus: int = 2) -> NodeSnapshot:
    cards = tuple(GpuInfo(g, f"GPU-{node}-{g}", "H100", 8192, 81559, 0) for g in range(gpus))
    return NodeSnapshot(node, at, cards, procs)


async def sweep(store: Store, snaps: list[NodeSnapshot], at: float) -> dict[HolderKey, float]:
    got = await store.samples.advance_idle(
        samples_of(snaps, at), RULE, keep_from=at - 86400, looked=Looked(tuple(snaps), at, GAP)
    )
    return got.held


def rows(store: Store) -> set[tuple[str, int, int, int]]:
    with store.engine.connect() as conn:
        got = conn.execute(sa.text("SELECT node, gpu_index, pid, start_ticks FROM gpu_holders"))
        return {(str(n), int(g), int(p), int(t)) for n, g, p, t in got}


async def test_two_processes_sweeping_in_turn_answer_as_one_fold(
    store: Store, replica: Store
) -> None:
    rng = random.Random(7)
    runs: dict[HolderKey, OnGpu] = {}
    at, holders, answers = T0, {1: 0, 2: 1, 3: 0}, 0
    for step in range(40):
        at += rng.choice([INTERVAL] * 6 + [2 * INTERVAL, 60.0, 0.5])
        if rng.random() < 0.3:  # a job ends, another comes (maybe old: a notebook)
            holders.pop(rng.choice(list(holders)), None)
            holders[100 + step] = rng.randrange(2)
        procs = tuple(
            proc(p, g, rng.choice([30.0, 5 * 3600.0, None])) for p, g in sorted(holders.items())
        )
        snaps = [snap(n, at, procs) for n in NODES if rng.random() > 0.15]
        runs = look(runs, snaps, at, GAP)
        bot = store if rng.random() < 0.5 else replica
        assert await sweep(bot, snaps, at) == on_gpu_since(runs), step
        status = Looked(tuple(snaps), at + 30.0, GAP)  # a status a little later: no write
        peeked = await replica.samples.idle_since([], RULE, keep_from=T0, looked=status)
        assert peeked.held == on_gpu_since(status.fold(runs)), step
        answers += len(runs)
    assert answers > 100


def every_row(store: Store) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        got = conn.execute(sa.text("SELECT * FROM gpu_holders ORDER BY node, gpu_index, pid"))
        return [tuple(r) for r in got]


async def test_a_status_look_writes_no_holder_row(store: Store, replica: Store) -> None:
    """``idle_since`` reads in a read transaction: a row written there would race the sweep's
    write transaction (a look that wrote left two rows on an empty store)."""
    a, b = proc(11, 0, 60.0), proc(22, 1, 3600.0)
    status = Looked((snap("n1", T0, (a,)),), T0, GAP)
    peeked = await replica.samples.idle_since([], RULE, keep_from=T0, looked=status)
    assert peeked.held == {("n1", 0, "11:110"): T0 - 60.0}
    assert every_row(store) == []
    await sweep(store, [snap("n1", T0, (a,))], T0)
    before = every_row(store)
    assert len(before) == 3  # each GPU's looks and a's run
    at = T0 + 30.0  # a look later: b has come, and n2 is seen for the first time
    status = Looked((snap("n1", at, (b,)), snap("n2", at, (a,))), at, GAP)
    peeked = await replica.samples.idle_since([], RULE, keep_from=T0, looked=status)
    assert peeked.held == {("n1", 1, "22:220"): at, ("n2", 0, "11:110"): at - 60.0}
    assert every_row(store) == before


async def test_a_holder_gone_and_a_node_not_looked_at_leave_no_row(store: Store) -> None:
    a, b = proc(11, 0, 60.0), proc(22, 1, 60.0)
    assert await sweep(store, [snap("n1", T0, (a, b)), snap("n2", T0, (a,))], T0) == {
        ("n1", 0, "11:110"): T0 - 60.0,
        ("n1", 1, "22:220"): T0 - 60.0,
        ("n2", 0, "11:110"): T0 - 60.0,
    }
    looks = {(n, g, 0, 0) for n in NODES for g in (0, 1)}  # pid 0: each GPU's own looks
    assert rows(store) == looks | {("n1", 0, 11, 110), ("n1", 1, 22, 220), ("n2", 0, 11, 110)}
    at = T0 + INTERVAL  # b has gone; n2 does not answer: its runs stand for now
    assert await sweep(store, [snap("n1", at, (a,))], at) == {
        ("n1", 0, "11:110"): T0 - 60.0,
        ("n2", 0, "11:110"): T0 - 60.0,
    }
    assert ("n1", 1, 22, 220) not in rows(store)
    at += INTERVAL  # n2 has not been looked at for longer than the gap
    await sweep(store, [snap("n1", at, (a,))], at)
    assert rows(store) == {("n1", 0, 0, 0), ("n1", 1, 0, 0), ("n1", 0, 11, 110)}
    await store.samples.prune_samples(at + 1.0)  # n1 gone from the fleet, its samples old
    assert rows(store) == set()


async def test_the_runs_are_written_in_the_sweeps_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep whose holder runs cannot be written stores no sample and no GPU run either."""
    await sweep(store, [snap("n1", T0, (proc(11, 0, 60.0),))], T0)
    before = rows(store)

    def broken(conn: sa.Connection, *args: object) -> None:
        conn.execute(sa.text("DELETE FROM gpu_holders"))
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(holder_runs, "write", broken)
    with pytest.raises(RuntimeError):
        await sweep(store, [snap("n1", T0 + INTERVAL, ())], T0 + INTERVAL)
    assert rows(store) == before
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM gpu_samples")).scalar() == 2
        last = conn.execute(sa.text("SELECT max(last_at) FROM gpu_idle")).scalar()
    assert last == text_of(T0)  # not the failed sweep's
