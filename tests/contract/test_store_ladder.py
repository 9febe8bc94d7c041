"""The reclaim ladder's rows on memory, SQLite and PostgreSQL: a step is taken once, from the
step before, and every change is in the audit chain with its row."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpubot.core.usage.ladder import Rung, Step
from gpubot.errors import UsageError
from gpubot.store import Store

T = 1_900_000_000.0
KEY = '["n1","0","idle-holder","4242:7"]'


def first() -> Rung:
    return Rung(KEY, "n1", 0, "alice", Step.DM, T, T)


async def records(store: Store) -> list[dict[str, object]]:
    rows = await store.verify()  # the chain still verifies with ladder records in it
    assert rows.ok, rows
    out = []
    for r in await store.records():
        if r.kind == "ladder":
            out.append(json.loads(r.payload))
    return out


async def test_each_step_is_taken_once_and_audited(store: Store) -> None:
    ladder = store.ladder
    dm = await ladder.climb(first(), Step.DM, T, {"evidence": {"samples": 5}})
    assert dm is not None and dm.step is Step.DM
    assert await ladder.climb(first(), Step.DM, T, {}) is None  # a second replica's DM: none
    both = await asyncio.gather(
        ladder.climb(dm, Step.REMIND, T + 60, {}), ladder.climb(dm, Step.REMIND, T + 61, {})
    )
    assert sorted(x is None for x in both) == [False, True]  # one winner
    assert await ladder.climb(dm, Step.OFFER, T + 70, {}) is None  # never skipping a step
    kept = await ladder.keep(KEY, "slack:U0ALICE", "eval tonight", T + 80)
    assert kept.kept and kept.kept_reason == "eval tonight"
    reminded = (await ladder.rungs())[KEY]
    assert await ladder.climb(reminded, Step.POST, T + 90, {}) is None  # kept: it stops
    await ladder.note(KEY, "free asked", "slack:U0CAROL", {"evidence": {"samples": 9}})
    assert [r.finding for r in await ladder.leave([KEY, "other"], T + 100, "busy")] == [KEY]
    assert await ladder.rungs() == {}
    with pytest.raises(UsageError, match="no longer on the reclaim ladder"):
        await ladder.keep(KEY, "slack:U0ALICE", "again", T + 110)
    said = [(r["ladder"], r.get("reason"), r.get("why")) for r in await records(store)]
    assert said == [
        ("dm", None, None),
        ("reminder", None, None),
        ("kept", "eval tonight", None),
        ("free asked", None, None),
        ("ended", None, "busy"),
    ]
