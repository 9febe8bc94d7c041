"""Maintenance windows in the store (issue 37), on SQLite in memory, SQLite and PostgreSQL: a
window is written with its audit record, one overlapping a node's window is refused even when
two are asked at once, and ``end`` closes it early (audited)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpubot.errors import UsageError
from gpubot.store import Store

T = 1_900_000_000.0
H = 3600.0


async def maint_records(store: Store) -> list[dict[str, object]]:
    checked = await store.verify()  # the chain still verifies with maint records in it
    assert checked.ok, checked
    return [json.loads(r.payload) for r in await store.records() if r.kind == "maint"]


async def test_open_list_end_audited(store: Store) -> None:
    m = store.maint
    w = await m.open(
        "node3", T + H, 4 * H, "kernel update", by="slack:U0OLGA", source="slack", now=T
    )
    assert (w.node, w.start, w.end, w.reason, w.by) == (
        "node3",
        T + H,
        T + 5 * H,
        "kernel update",
        "slack:U0OLGA",
    )
    other = await m.open("node4", T + 2 * H, H, "bios", by="slack:U0OLGA", source="slack", now=T)
    assert [x.id for x in await m.live(T)] == [w.id, other.id]
    assert [x.id for x in await m.live(T, "node3")] == [w.id]
    assert [x.id for x in await m.live(T + 3 * H)] == [w.id]  # node4's is over
    with pytest.raises(UsageError, match="node3 has a window already"):
        await m.open("node3", T + 4 * H, 2 * H, "again", by="slack:U0OLGA", source="slack", now=T)
    ended = await m.end("node3", by="console:U0OLGA", source="console", now=T + 2 * H)
    assert ended.ended_at == T + 2 * H and ended.until == T + 2 * H
    assert await m.live(T + 2 * H, "node3") == []  # closed early: not live any more
    again = await m.open(
        "node3", T + 3 * H, H, "again", by="slack:U0OLGA", source="slack", now=T + 2 * H
    )
    assert again.id not in (w.id, other.id)  # the node is free to plan after its end
    with pytest.raises(UsageError, match="node5 has no maintenance window"):
        await m.end("node5", by="console:U0OLGA", source="console", now=T)
    await m.refused(
        "node3", by="slack:U0BOB", source="slack", asked="maint end node3", why="on call"
    )
    said = [(r["maint"], r.get("window")) for r in await maint_records(store)]
    assert said == [
        ("opened", w.id),
        ("opened", other.id),
        ("ended", w.id),
        ("opened", again.id),
        ("refused", None),
    ]


async def test_two_overlapping_windows_at_once_one_wins(store: Store) -> None:
    m = store.maint
    got = await asyncio.gather(
        m.open("node3", T + H, 4 * H, "a", by="slack:U1", source="slack", now=T),
        m.open("node3", T + 2 * H, 4 * H, "b", by="slack:U2", source="slack", now=T),
        return_exceptions=True,
    )
    assert sorted(type(g).__name__ for g in got) == ["UsageError", "Window"]
    assert len(await m.live(T, "node3")) == 1
