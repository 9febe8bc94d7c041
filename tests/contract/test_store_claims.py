"""GPU claims on every database (issue 26): one winner of a contested claim, limits, extend,
release, expiry, the queue's conditional hold, ``intervals``, every change audited."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.core.claims.rules import (
    ClaimState,
    Conflict,
    Granted,
    Limit,
    OverLimit,
    Wait,
    WaitState,
)
from gpubot.errors import UsageError
from gpubot.store import Store, open_store
from tests.fixtures.claim_requests import T0, H, req
from tests.fixtures.db import raw_engine


async def test_claim_conflict_extend_release_expire_audited(store: Store) -> None:
    got = await store.claims.claim(req("U1", (2, 3)))
    assert isinstance(got, Granted) and [c.gpu for c in got.claims] == [2, 3]
    refused = await store.claims.claim(req("U2", (3, 4)))
    assert isinstance(refused, Conflict)
    assert [(c.gpu, c.chat_id, c.end) for c in refused.held] == [(3, "U1", T0 + 4 * H)]
    again = await store.claims.claim(req("U1", (3,)))  # one's own claim is a conflict too
    assert isinstance(again, Conflict)
    ext = await store.claims.extend(
        "U1", ("node3", (2,)), 2 * H, most_s=lambda n: 5 * H, now=T0 + 60, source="test"
    )
    assert [(c.gpu, c.end, cut) for c, cut in ext] == [(2, T0 + 5 * H, True)]  # the limit cut it
    gone = await store.claims.release("U1", ("node3", (3,)), now=T0 + 120, source="test")
    assert [(c.gpu, c.state) for c in gone] == [(3, ClaimState.RELEASED)]
    assert isinstance(await store.claims.claim(req("U2", (3, 4), start=T0 + 130)), Granted)
    assert await store.claims.expire(T0 + 4 * H - 1) == []
    expired = await store.claims.expire(T0 + 4 * H + 200)
    assert sorted(c.gpu for c in expired) == [3, 4]
    assert await store.claims.expire(T0 + 4 * H + 300) == []  # once
    assert [c.gpu for c in await store.claims.active()] == [2]
    changes = [r.data["change"] for r in await store.records() if r.kind == "claim"]
    assert changes == ["claimed"] * 2 + ["extended", "released"] + ["claimed"] * 2 + ["expired"] * 2
    assert (await store.verify()).ok


async def test_limits_fleet_and_group(store: Store) -> None:
    fleet = Limit(3)
    group = Limit(1, ("node3",), "h200")
    over = await store.claims.claim(req("U1", (0, 1), limits=(fleet, group)))
    assert isinstance(over, OverLimit) and over.limit is group
    assert "group h200" in over.text() and "limit is 1" in over.text()
    assert isinstance(await store.claims.claim(req("U1", (0, 1), limits=(fleet,))), Granted)
    over = await store.claims.claim(req("U1", (0, 1), node="node4", limits=(fleet,)))
    assert isinstance(over, OverLimit) and (over.have, over.asked) == (2, 2)
    assert [r for r in await store.records() if r.kind == "claim"].__len__() == 2


async def test_intervals_cut_to_the_window(store: Store) -> None:
    await store.claims.claim(req("U1", (0,)))
    await store.claims.release("U1", ("node3", ()), now=T0 + H, source="test")
    await store.claims.claim(req("U2", (1,), start=T0 + 2 * H, end=T0 + 10 * H))
    got = sorted(store.claims.intervals(T0 + 0.5 * H, T0 + 3 * H))
    assert got == [
        ("node3", 0, "u1", T0 + 0.5 * H, T0 + H),
        ("node3", 1, "u2", T0 + 2 * H, T0 + 3 * H),
    ]


def _wait(chat: str, gpus: tuple[int, ...] = (), count: int = 1) -> Wait:
    return Wait(0, "node3", gpus, count, 4 * H, chat.lower(), chat, T0)


async def test_queue_hold_take_lapse_leave(store: Store) -> None:
    first = await store.claims.add_wait(_wait("U1", (2,)), "test")
    second = await store.claims.add_wait(_wait("U2", (2,)), "test")
    assert [w.id for w in await store.claims.waits("node3")] == [first.id, second.id]
    held = await store.claims.offer(first.id, (2,), T0 + 900, T0)
    assert held is not None and held.state is WaitState.OFFERED
    assert await store.claims.offer(first.id, (2,), T0 + 900, T0) is None  # once
    assert await store.claims.offer(second.id, (2,), T0 + 900, T0) is None  # the GPU is held
    blocked = await store.claims.claim(req("U3", (2,), start=T0 + 10))
    assert isinstance(blocked, Conflict) and [w.id for w in blocked.holds] == [first.id]
    with pytest.raises(UsageError, match="someone else's"):
        await store.claims.claim(req("U2", (2,), start=T0 + 10, wait_id=first.id))
    lapsed = await store.claims.lapse(T0 + 901)
    assert [w.id for w in lapsed] == [first.id]
    with pytest.raises(UsageError, match="has ended"):
        await store.claims.claim(req("U1", (2,), start=T0 + 902, wait_id=first.id))
    assert await store.claims.offer(second.id, (2,), T0 + 1800, T0 + 902) is not None
    took = await store.claims.claim(req("U2", (2,), start=T0 + 903, wait_id=second.id))
    assert isinstance(took, Granted)
    third = await store.claims.add_wait(_wait("U3", count=2), "test")
    left = await store.claims.leave("U3", None, T0 + 904, "test")
    assert [w.id for w in left] == [third.id] and await store.claims.waits() == []
    changes = [r.data["change"] for r in await store.records() if r.kind == "claim"]
    assert changes == [
        "queued",
        "queued",
        "offered",
        "lapsed",
        "offered",
        "taken",
        "claimed",
        "queued",
        "left",
    ]


def _race(url: str, n: int, attempt: Any) -> list[Any]:
    """Run ``attempt(store, i)`` in ``n`` threads at once, each with its own store (engine)."""
    stores = [open_store(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        async def go() -> Any:
            barrier.wait()
            return await attempt(stores[i], i)

        results[i] = asyncio.run(go())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    return results


async def test_contested_claim_has_one_winner(store: Store, fresh_db_url: str) -> None:
    results = await asyncio.to_thread(
        _race, fresh_db_url, 6, lambda s, i: s.claims.claim(req(f"U{i}", (1, 2)))
    )
    wins = [r for r in results if isinstance(r, Granted)]
    assert len(wins) == 1, results
    assert all(isinstance(r, Conflict) for r in results if r is not wins[0]), results
    assert len(await store.claims.active()) == 2
    w = await store.claims.add_wait(_wait("U9", (5,)), "test")
    offers = await asyncio.to_thread(
        _race, fresh_db_url, 4, lambda s, i: s.claims.offer(w.id, (5,), T0 + 900, T0)
    )
    assert sum(o is not None for o in offers) == 1, offers
    assert (await store.verify()).ok


async def test_the_database_refuses_a_second_active_claim_of_a_gpu(
    store: Store, fresh_db_url: str
) -> None:
    """The backstop under the conditional write: the unique ``holding`` column. A control
    writes past the store's check: the database itself refuses the second active claim."""
    assert isinstance(await store.claims.claim(req("U1", (2,))), Granted)
    row = (
        'INSERT INTO claims (node, gpu_index, gpu_uuid, "user", chat_id, started_at, ends_at,'
        " note, state, holding) VALUES ('node3', 2, 'GPU-0002', 'u2', 'U2',"
        " '2027-01-15T08:00:00.000000Z', '2027-01-15T12:00:00.000000Z', '', 'active', {h})"
    )
    engine = raw_engine(fresh_db_url)
    try:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(row.format(h="'node3:2'"))
        with engine.begin() as conn:  # an ended claim holds nothing: any number of them
            conn.exec_driver_sql(row.format(h="NULL").replace("'active'", "'released'"))
            conn.exec_driver_sql(row.format(h="NULL").replace("'active'", "'released'"))
    finally:
        engine.dispose()


async def test_an_intruder_is_told_once_whichever_replica_swept(store: Store) -> None:
    got = await store.claims.claim(req("U1", (2,)))
    assert isinstance(got, Granted)
    (c,) = got.claims
    assert await store.claims.tell_intruder(c.id, "k1", T0 + 1)
    assert not await store.claims.tell_intruder(c.id, "k1", T0 + 2)  # another replica: no
    assert await store.claims.tell_intruder(c.id, "k2", T0 + 3)  # another intruder: yes
    assert not await store.claims.tell_intruder(c.id, "k1", T0 + 4)  # the first: still told
    assert not await store.claims.tell_intruder(c.id, "k2", T0 + 5)
    assert await store.claims.tell_intruder(c.id, "node_1:k%", T0 + 6)  # LIKE's own characters
    assert not await store.claims.tell_intruder(c.id, "node_1:k%", T0 + 7)
    changes = [r.data["change"] for r in await store.records() if r.kind == "claim"]
    assert changes == ["claimed", "intruder", "intruder", "intruder"]
