"""Store growth at a year of a 1,000-node fleet, SQLite and PostgreSQL: measured, then scaled.

::

    python -m benchmarks.store_growth            # 1,000 nodes x 8 GPUs: 400 sweep records,
                                                 # 12 sweeps of samples, each database
    python -m benchmarks.store_growth --smoke    # tiny: keeps it working

A year is too big to write here (105,120 sweeps at the 5-minute default), so this writes what a
year is made of through gpubot's own store (``open_store``: the audit chain, the sample store)
and measures the bytes each piece adds, tables and indexes together: a sweep's audit record
in the steady shape (a count, a digest, nothing failed or changed; the process's first names
every node and is written first, not counted), and one sweep's 8,000 GPU samples with the idle
runs advanced (``advance_idle``, as a sweep does). The year is then arithmetic, said as such:
records grow without end (the audit log is append-only); samples stop growing at
``[sweep] keep_samples`` (14 days by default: pruned in bounded batches), so their size is the
window's, not the year's. PostgreSQL: a schema of its own in the ``test`` database on
127.0.0.1:5432 (``GPUBOT_TEST_PG_URL`` to change), dropped after; sizes from
``pg_total_relation_size`` after ``VACUUM``. SQLite: pages in use after a checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PG_BASE = os.environ.get("GPUBOT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
GPUS = 8
SWEEPS_A_YEAR = 365 * 86400 // 300
KEPT_SWEEPS = 14 * 86400 // 300


@contextmanager
def database(kind: str, folder: Path) -> Iterator[tuple[str, Any]]:
    """Yield a migrated database's URL and a function returning its size in bytes."""
    import sqlalchemy as sa

    from gpubot.store import open_store

    if kind == "sqlite":
        path = folder / f"growth-{secrets.token_hex(4)}.db"
        url = f"sqlite:///{path}"

        def sqlite_size() -> int:
            db = sqlite3.connect(path)
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                pages = db.execute("PRAGMA page_count").fetchone()[0]
                free = db.execute("PRAGMA freelist_count").fetchone()[0]
                size = db.execute("PRAGMA page_size").fetchone()[0]
            finally:
                db.close()
            return int((pages - free) * size)

        store = open_store(url, check_schema=False)
        store.upgrade()
        store.close()
        yield url, sqlite_size
        return
    schema = f"growth_{secrets.token_hex(6)}"
    admin = sa.create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = f"{PG_BASE}?options=-csearch_path%3D{schema}"
        store = open_store(url, check_schema=False)
        store.upgrade()
        store.close()

        def pg_size() -> int:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'SET search_path TO "{schema}"')
                conn.exec_driver_sql("VACUUM")
                q = (
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    f"WHERE n.nspname = '{schema}' AND c.relkind = 'r'"
                )
                return int(conn.exec_driver_sql(q).scalar_one())

        yield url, pg_size
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


async def measure(kind: str, folder: Path, nodes: int, records: int, sweeps: int) -> dict[str, Any]:
    """Write ``records`` sweep records and ``sweeps`` sweeps of samples; return bytes each."""
    import gpubot.store.waits as waits
    from gpubot.core.usage.idle import GpuSample
    from gpubot.core.usage.idle_runs import RunRule
    from gpubot.store import open_store

    waits.DEADLINE_S = 600.0  # a loaded shared box writes slowly; sizes, not speed, are measured

    names = [f"node{i}" for i in range(1, nodes + 1)]
    calm: dict[str, list[str]] = {"added": [], "removed": [], "recovered": []}
    with database(kind, folder) as (url, size):
        store = open_store(url)
        try:
            args: dict[str, Any] = {"kind": "sweep", "actor": "gpubot:bench", "source": "schedule"}
            await store.record_query(**args, nodes=names, failed={}, seconds=61.2, changed=None)
            before = size()
            for _ in range(records):
                await store.record_query(**args, nodes=names, failed={}, seconds=61.2, changed=calm)
            per_record = (size() - before) / records
            rule = RunRule.of(4096, 900.0)
            t0 = 1_900_000_000.0
            first = [
                GpuSample(n, g, f"GPU-{n}-{g}", t0, 60, 8192) for n in names for g in range(GPUS)
            ]
            await store.samples.advance_idle(first, rule, keep_from=0.0)  # the runs' rows
            before = size()
            for i in range(1, sweeps + 1):
                at = t0 + i * 300.0
                batch = [
                    GpuSample(s.node, s.gpu, s.uuid, at, 0 if s.gpu == 0 else 60, 8192)
                    for s in first
                ]
                await store.samples.advance_idle(batch, rule, keep_from=0.0)
            per_sample = (size() - before) / (sweeps * len(first))
        finally:
            store.close()
    return {"kind": kind, "per_record": per_record, "per_sample": per_sample}


def report(nodes: int, rows: list[dict[str, Any]], records: int, sweeps: int) -> list[str]:
    samples_kept = KEPT_SWEEPS * nodes * GPUS
    out = [
        f"Store growth at {nodes} nodes × {GPUS} GPUs, sweeps every 5 minutes "
        f"({SWEEPS_A_YEAR:,} a year), samples kept 14 days ({samples_kept:,} rows); measured "
        f"over {records} sweep records and {sweeps} sweeps of samples, then scaled "
        "(extrapolated, not written):",
        "",
        "| database | bytes per sweep record | a year of sweep records | bytes per sample "
        "| 14 days of samples (steady) | a year, samples kept 365 d |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        year = r["per_record"] * SWEEPS_A_YEAR
        window = r["per_sample"] * samples_kept
        whole = r["per_sample"] * SWEEPS_A_YEAR * nodes * GPUS
        out.append(
            f"| {r['kind']} | {r['per_record']:.0f} | {year / 2**20:.0f} MiB | "
            f"{r['per_sample']:.0f} | {window / 2**30:.2f} GiB | {whole / 2**30:.1f} GiB |"
        )
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.store_growth")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--records", type=int, default=400)
    p.add_argument("--sweeps", type=int, default=12)
    p.add_argument("--kinds", default="sqlite,postgresql")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.records, a.sweeps, a.kinds = 20, 20, 2, "sqlite"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="gpubot-growth-") as tmp:
        rows = [
            asyncio.run(measure(k, Path(tmp), a.nodes, a.records, a.sweeps))
            for k in a.kinds.split(",")
        ]
    print("\n".join(report(a.nodes, rows, a.records, a.sweeps)))
    print(f"\n(load average {load} at start)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
