"""Parallel writers (separate processes, separate engines) never fork the chain."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from pathlib import Path

from gpubot.store import Store, open_store
from gpubot.store.engine import write_tx
from tests.fixtures.db import not_in_memory, temp_database

REPO = Path(__file__).resolve().parents[2]
WRITERS = 4
ROUNDS = 8  # each round: intent, event, outcome, query

WRITER = """
import asyncio, sys
from gpubot.store import open_store

url, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main() -> None:
    store = open_store(url)
    await store.records(limit=1)  # connected before the start line
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(rounds):
        aid = await store.begin_action(kind="reset", actor=name, source="cli", command=f"r{i}",
                                       node="node1", gpus=[i % 8], plan={"round": i})
        await store.record_event(aid, {"type": "signal", "round": i})
        await store.finish_action(aid, status="ok", result={"round": i})
        await store.record_query(kind="status", actor=name, source="cli", nodes=["node1"],
                                 failed={}, seconds=0.0)
        await asyncio.sleep(0.02)  # a pause between rounds, as real writers have: SQLite's
        # lock is not fair, and a writer that never pauses may keep taking it back
    store.close()

asyncio.run(main())
"""


def _run_writers(url: str) -> None:
    """Start the writers, let them all go at once, and check that each exits cleanly."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", WRITER, url]
    procs = [
        subprocess.Popen(
            [*argv, f"w{n}", str(ROUNDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(WRITERS)
    ]
    try:
        for p in procs:  # all connected: start them together
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * WRITERS, outputs


async def test_parallel_writers_never_fork_the_chain(
    store: Store, fresh_db_url: str, db_kind: str
) -> None:
    not_in_memory(db_kind, "lives in one process: these writers are processes")
    await asyncio.to_thread(_run_writers, fresh_db_url)
    records = await store.records(limit=10_000)
    total = WRITERS * ROUNDS * 4
    assert [r.seq for r in records] == list(range(1, total + 1))
    assert len({r.prev_hash for r in records}) == total  # no two records follow the same one
    result = await store.verify()
    assert (result.ok, result.checked) == (True, total), result.reason
    for n in range(WRITERS):  # each writer's actions are whole
        mine = await store.actions(actor=f"w{n}", limit=100)
        assert sorted(a.command for a in mine) == sorted(f"r{i}" for i in range(ROUNDS))
        assert {a.status for a in mine} == {"ok"}
    # interleaved, not one writer after another: the lock is taken per append
    actors = [r.actor for r in records]
    switches = sum(1 for a, b in itertools.pairwise(actors) if a != b)
    assert switches >= WRITERS


async def test_a_held_write_lock_delays_writers_but_not_readers(
    store: Store, fresh_db_url: str, db_kind: str
) -> None:
    not_in_memory(db_kind, "has no WAL: its readers wait for the writer (the test below)")
    other = open_store(fresh_db_url)  # e.g. the CLI next to a running bot
    try:
        with write_tx(store.engine):  # BEGIN IMMEDIATE on SQLite, the advisory lock on PostgreSQL
            assert await other.actions() == []  # readers go on
            writer = asyncio.create_task(
                other.begin_action(
                    kind="reset",
                    actor="cli:root",
                    source="cli",
                    command="x",
                    node="node1",
                    gpus=[0],
                    plan=None,
                )
            )
            await asyncio.sleep(0.3)
            assert not writer.done()  # waiting for the lock, not failing at once
        assert await asyncio.wait_for(writer, 10) == 1
    finally:
        other.close()


async def test_in_memory_a_held_write_lock_delays_writers_and_readers(tmp_path: Path) -> None:
    """The memory store's one difference: SQLite keeps a rollback journal in memory, so a
    reader waits for the writer (its busy timeout), then reads what was committed."""
    with temp_database("memory", tmp_path) as url:
        store, other = open_store(url), open_store(url)
        try:
            with write_tx(store.engine):
                reader = asyncio.create_task(other.actions())
                writer = asyncio.create_task(
                    other.begin_action(
                        kind="reset",
                        actor="cli:root",
                        source="cli",
                        command="x",
                        node="node1",
                        gpus=[0],
                        plan=None,
                    )
                )
                await asyncio.sleep(0.3)
                assert not reader.done() and not writer.done()  # waiting, not failing
            assert len(await asyncio.wait_for(reader, 10)) <= 1  # before or after the writer
            assert await asyncio.wait_for(writer, 10) == 1
            assert [a.id for a in await other.actions()] == [1]
        finally:
            store.close()
            other.close()
