"""GPU samples (``core.ports.SampleStore``) on SQLite and PostgreSQL: insert, window, prune."""

from __future__ import annotations

import sqlalchemy as sa

from gpubot.core.ports import SampleStore
from gpubot.core.usage.idle import GpuSample
from gpubot.errors import StoreError
from gpubot.store import Store, open_store

T0 = 1_900_000_000.25  # unix time; a quarter second, so that sub-second times round-trip


def sweep(at: float, *rows: tuple[str, int, int | None, int | None]) -> list[GpuSample]:
    """One sweep's samples: (node, gpu, utilisation, memory) at ``at``."""
    return [GpuSample(n, g, f"GPU-{n}-{g}", at, u, m) for n, g, u, m in rows]


def port(store: Store) -> SampleStore:
    return store.samples  # the adapter is what the sweep service is given: check it fits


async def test_samples_round_trip_and_come_back_by_gpu_and_time(store: Store) -> None:
    samples = port(store)
    await samples.add_samples([])  # nothing to write: no statement at all
    await samples.add_samples(sweep(T0 + 600, ("n2", 1, 0, 8192), ("n1", 0, 35, 1024)))
    await samples.add_samples(
        sweep(T0, ("n1", 0, 0, 4096), ("n1", 1, None, None), ("n2", 1, 100, 8192))
    )
    got = await samples.samples_since(T0)
    assert got == [
        GpuSample("n1", 0, "GPU-n1-0", T0, 0, 4096),
        GpuSample("n1", 0, "GPU-n1-0", T0 + 600, 35, 1024),
        GpuSample("n1", 1, "GPU-n1-1", T0, None, None),  # unknown stays unknown, never 0
        GpuSample("n2", 1, "GPU-n2-1", T0, 100, 8192),
        GpuSample("n2", 1, "GPU-n2-1", T0 + 600, 0, 8192),
    ]
    # the window: from ``since`` on (inclusive), all GPUs or only some
    assert [(s.node, s.gpu, s.taken_at) for s in await samples.samples_since(T0 + 0.001)] == [
        ("n1", 0, T0 + 600),
        ("n2", 1, T0 + 600),
    ]
    only = await samples.samples_since(T0, gpus={("n2", 1), ("n9", 0)})
    assert [(s.node, s.gpu, s.utilization_pct) for s in only] == [("n2", 1, 100), ("n2", 1, 0)]
    assert await samples.samples_since(T0, gpus=set()) == []
    assert await samples.samples_since(T0 + 601) == []


async def test_prune_deletes_only_what_is_older(store: Store) -> None:
    samples = port(store)
    for i in range(5):
        await samples.add_samples(sweep(T0 + i * 300, ("n1", 0, 0, 9000), ("n1", 1, 0, 9000)))
    assert await samples.prune_samples(T0 + 600) == 4  # the sweeps at T0 and T0+300
    left = await samples.samples_since(0)
    assert sorted({s.taken_at for s in left}) == [T0 + 600, T0 + 900, T0 + 1200]
    assert await samples.prune_samples(T0 + 600) == 0
    assert (await store.verify()).ok  # samples are no part of the audit chain


async def test_one_sweep_is_one_batched_insert(store: Store) -> None:
    statements: list[tuple[str, bool]] = []

    def seen(
        conn: object,
        cursor: object,
        statement: str,
        params: object,
        context: object,
        executemany: bool,
    ) -> None:
        if "gpu_samples" in statement and statement.lstrip().upper().startswith("INSERT"):
            statements.append((statement, executemany))

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        rows = [("n1", g, 0, 8192) for g in range(8)] + [("n2", g, 50, 100) for g in range(8)]
        await port(store).add_samples(sweep(T0, *rows))
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)
    assert len(await port(store).samples_since(T0)) == 16
    # one statement: an executemany (SQLite) or one multi-row INSERT (psycopg "insertmanyvalues")
    assert len(statements) == 1, statements


async def test_a_database_that_is_gone_fails_as_a_store_error(closed_port_url: str) -> None:
    down = open_store(closed_port_url, check_schema=False)
    try:
        for call in (
            down.samples.add_samples(sweep(T0, ("n1", 0, 0, 1))),
            down.samples.samples_since(T0),
            down.samples.prune_samples(T0),
        ):
            try:
                await call
            except StoreError as exc:
                assert "GPU samples" in str(exc)
            else:
                raise AssertionError("no StoreError")
    finally:
        down.close()


def test_downgrading_one_step_drops_only_the_samples(fresh_db_url: str) -> None:
    store = open_store(fresh_db_url, check_schema=False)
    try:
        store.downgrade("0002")
        tables = set(sa.inspect(store.engine).get_table_names())
        assert "gpu_samples" not in tables and {"audit_log", "alerts"} <= tables
        store.upgrade()
        assert "gpu_samples" in set(sa.inspect(store.engine).get_table_names())
    finally:
        store.close()
