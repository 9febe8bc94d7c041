"""``verify`` walks the chain a page at a time: records past the first page are checked too, a
record missing at a page boundary is found, and a missing chain head is said, never crashed on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.errors import StoreError
from gpubot.store import Store, open_store
from gpubot.store.audit import PAGE, append
from gpubot.store.engine import write_tx
from tests.fixtures.db import tamper, temp_copy, temp_database

N = PAGE + 3  # two pages: a full one and a short one


BATCH = 200  # records per transaction: a PostgreSQL write lock is the whole database's, and
# one transaction of 2000 appends held it for seconds, past the lease ttl of a test beside it


def _append_many(store: Store, n: int) -> None:
    """Append ``n`` query records, ``BATCH`` a transaction (the store's own append, at speed)."""
    for start in range(0, n, BATCH):
        with write_tx(store.engine) as conn:
            for i in range(start, min(n, start + BATCH)):
                append(
                    conn,
                    kind="query",
                    actor=f"U{i}",
                    source="test",
                    node=None,
                    payload={"query": "status", "i": i},
                )


@pytest.fixture(scope="module")
def long_log_url(db_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of each kind holding a log of ``N`` records, built once for the module."""
    with temp_database(db_kind, tmp_path_factory.mktemp("log")) as url:
        store = open_store(url)
        try:
            _append_many(store, N)
        finally:
            store.close()
        yield url


@pytest.fixture
def log_url(db_kind: str, long_log_url: str, tmp_path: Path) -> Iterator[str]:
    """The test's own copy of that database: what it tampers with is its own."""
    with temp_copy(db_kind, long_log_url, tmp_path) as url:
        yield url


@pytest.fixture
def long_log(log_url: str) -> Iterator[Store]:
    store = open_store(log_url)
    try:
        yield store
    finally:
        store.close()


async def test_a_log_of_several_pages_verifies_whole(long_log: Store) -> None:
    result = await long_log.verify()
    assert result.ok, result.reason
    assert result.checked == N and result.head_seq == N


@pytest.mark.parametrize(
    ("seq", "words"),
    [
        (PAGE, "removed"),  # the last record of the first page
        (PAGE + 1, "removed"),  # the first record of the second page
        (PAGE + 2, "removed"),  # inside the last, short page
    ],
)
async def test_a_record_removed_at_a_page_boundary_is_found(
    long_log: Store, log_url: str, seq: int, words: str
) -> None:
    tamper(log_url, f"DELETE FROM audit_log WHERE seq = {seq}")
    result = await long_log.verify()
    assert not result.ok and result.first_bad_seq == seq, result.reason
    assert f"record {seq} was {words}" in result.reason
    assert result.checked == seq - 1


async def test_a_record_edited_on_a_later_page_is_found(long_log: Store, log_url: str) -> None:
    seq = PAGE + 2
    tamper(log_url, f"UPDATE audit_log SET actor = 'U0MALLORY' WHERE seq = {seq}")
    result = await long_log.verify()
    assert (result.ok, result.first_bad_seq) == (False, seq)
    assert f"record {seq} was edited" in result.reason


async def test_a_missing_head_is_said_and_nothing_is_appended(
    store: Store, fresh_db_url: str
) -> None:
    await store.record_query(
        kind="status", actor="U1", source="test", nodes=["node1"], failed={}, seconds=0.1
    )
    tamper(fresh_db_url, "DELETE FROM audit_head")
    result = await store.verify()
    assert not result.ok
    assert result.reason == "the chain head is missing"
    with pytest.raises(
        StoreError,
        match=r"the audit chain head is missing: was `gpubot db "
        r"upgrade` run\?",
    ):
        await store.record_query(
            kind="status", actor="U2", source="test", nodes=[], failed={}, seconds=0.1
        )
    assert len(await store.queries()) == 1  # the record before stays; none was added
