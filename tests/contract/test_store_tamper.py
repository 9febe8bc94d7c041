"""``verify`` finds records edited, removed or reordered with SQL behind gpubot's back."""

from __future__ import annotations

import pytest

from gpubot.store import Store
from gpubot.store.chain import Chained, record_hash
from tests.fixtures.db import raw_engine, tamper

EDITED_PAYLOAD = '{"action":"reset","command":"nothing happened","gpus":[],"plan":null}'


async def _five_records(store: Store) -> None:
    aid = await store.begin_action(
        kind="reset",
        actor="U1 (alice)",
        source="slack",
        command="/gpu reset node3 0",
        node="node3",
        gpus=[0],
        plan={"pids": [11]},
    )
    await store.record_event(aid, {"type": "signal", "pid": 11, "signal": "SIGTERM"})
    await store.record_event(aid, {"type": "signal", "pid": 11, "signal": "SIGKILL"})
    await store.finish_action(aid, status="ok", result={"0": "freed"})
    await store.record_query(
        kind="status", actor="U2", source="slack", nodes=["node3"], failed={}, seconds=0.2
    )
    assert (await store.verify()).checked == 5


def _rehashed_edit(url: str) -> list[str]:
    """SQL that edits record 1 and recomputes its hash (but cannot fix record 2's link)."""
    engine = raw_engine(url)
    with engine.connect() as conn:
        r = conn.exec_driver_sql("SELECT * FROM audit_log WHERE seq = 1").mappings().one()
    engine.dispose()
    fields = {
        k: r[k] for k in ("seq", "action_id", "kind", "created_at", "actor", "source", "node")
    }
    digest = record_hash(r["prev_hash"], Chained(**fields, payload=EDITED_PAYLOAD))
    return [f"UPDATE audit_log SET payload = '{EDITED_PAYLOAD}', hash = '{digest}' WHERE seq = 1"]


TAMPERING = [
    (
        "edited",
        lambda url: [f"UPDATE audit_log SET payload = '{EDITED_PAYLOAD}' WHERE seq = 1"],
        1,
        "record 1 was edited",
    ),
    (
        "actor edited",
        lambda url: ["UPDATE audit_log SET actor = 'U9 (mallory)' WHERE seq = 3"],
        3,
        "record 3 was edited",
    ),
    ("removed", lambda url: ["DELETE FROM audit_log WHERE seq = 3"], 3, "record 3 was removed"),
    (
        "swapped",
        lambda url: [
            "UPDATE audit_log SET seq = -2 WHERE seq = 2",
            "UPDATE audit_log SET seq = 2 WHERE seq = 3",
            "UPDATE audit_log SET seq = 3 WHERE seq = -2",
        ],
        2,
        "record 2 is out of order",
    ),
    (
        "last removed",
        lambda url: ["DELETE FROM audit_log WHERE seq = 5"],
        5,
        "removed from the end",
    ),
    ("rewritten", _rehashed_edit, 1, "record 1 was rewritten"),
]


@pytest.mark.parametrize(("case", "sql", "bad", "words"), TAMPERING, ids=[t[0] for t in TAMPERING])
async def test_verify_names_the_first_tampered_record(
    store: Store, fresh_db_url: str, case: str, sql: object, bad: int, words: str
) -> None:
    await _five_records(store)
    tamper(fresh_db_url, *sql(fresh_db_url))  # type: ignore[operator]
    result = await store.verify()
    assert not result.ok
    assert result.first_bad_seq == bad
    assert words in result.reason
    assert result.checked == bad - 1


async def test_appending_after_tampering_does_not_hide_it(store: Store, fresh_db_url: str) -> None:
    await _five_records(store)
    tamper(fresh_db_url, "DELETE FROM audit_log WHERE seq = 2")
    await store.record_query(
        kind="status", actor="U2", source="slack", nodes=[], failed={}, seconds=0.1
    )
    result = await store.verify()
    assert (result.ok, result.first_bad_seq) == (False, 2)
