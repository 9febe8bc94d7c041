"""Alert state of sweep findings on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpubot.core.alerting import MessageRef
from gpubot.core.findings import FindingKey
from gpubot.errors import StoreError
from gpubot.store import Store

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ORPHAN = FindingKey("node3", 2, "orphaned-vram")
ZOMBIE = FindingKey("node3", 0, "zombie-process", "pid:4242:991")
DOWN = FindingKey("node7", None, "node-unreachable")


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def test_findings_count_consecutive_sweeps(store: Store) -> None:
    first = await store.alerts.upsert_seen([ORPHAN, ZOMBIE, ORPHAN], _at(0))
    assert [(a.key, a.seen_count) for a in first] == [(ORPHAN, 1), (ZOMBIE, 1)]
    await store.alerts.upsert_seen([ORPHAN, DOWN], _at(5))
    [orphan, zombie, down] = await store.alerts.open_alerts()
    assert (orphan.key, orphan.seen_count, orphan.first_seen, orphan.last_seen) == (
        ORPHAN,
        2,
        _at(0),
        _at(5),
    )
    assert (zombie.seen_count, zombie.last_seen) == (1, _at(0))
    assert (down.key, down.key.gpu, down.alerted_at) == (DOWN, None, None)


async def test_alert_remind_snooze_resolve_and_come_back(store: Store) -> None:
    await store.alerts.upsert_seen([ORPHAN], _at(0))
    a = await store.alerts.mark_alerted(ORPHAN, ref=MessageRef("C1/1.1"), now=_at(1))
    assert (a.alerted_at, a.ref) == (_at(1), "C1/1.1")
    assert (await store.alerts.mark_reminded(ORPHAN, _at(61))).reminded_at == _at(61)
    s = await store.alerts.snooze(ORPHAN, _at(24 * 60), by="U1", now=_at(62))
    assert s.snoozed_until == _at(24 * 60)  # snoozed until then, not after

    [gone] = await store.alerts.mark_resolved([ORPHAN, ZOMBIE], _at(70))
    assert gone.resolved_at == _at(70)
    assert await store.alerts.open_alerts() == []
    assert await store.alerts.mark_resolved([ORPHAN], _at(71)) == []

    [back] = await store.alerts.upsert_seen([ORPHAN], _at(80))
    assert (back.seen_count, back.first_seen, back.resolved_at, back.alerted_at) == (
        1,
        _at(80),
        None,
        None,
    )
    assert back.snoozed_until == _at(24 * 60)  # a snooze outlives one occurrence

    trail = [(r.data["alert"], r.actor) for r in await store.records() if r.kind == "alert"]
    assert trail == [
        ("alerted", "gpubot"),
        ("reminded", "gpubot"),
        ("snoozed", "U1"),
        ("resolved", "gpubot"),
    ]
    assert (await store.verify()).ok


async def test_an_unseen_finding_cannot_be_alerted(store: Store) -> None:
    with pytest.raises(StoreError, match="no finding"):
        await store.alerts.mark_alerted(DOWN, ref=MessageRef("C1/1.1"), now=T0)
