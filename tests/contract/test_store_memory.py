"""``memory://``: the store over SQLite in memory, a first-class URL (``gpubot.store.engine``).

The contract suite runs over it with every other database (``tests/fixtures/db.py``); these are
what only a memory database has: a fresh one per ``memory://``, sharing by name, and its end.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpubot.errors import StoreError
from gpubot.store import Store, open_store
from gpubot.store.engine import memory_url
from gpubot.store.version import HEAD


async def _act(store: Store, command: str) -> int:
    return await store.begin_action(
        kind="reset",
        actor="cli:root",
        source="cli",
        command=command,
        node="node1",
        gpus=[0],
        plan=None,
    )


async def test_each_plain_memory_url_is_a_new_migrated_database() -> None:
    one, two = open_store("memory://"), open_store("memory://")
    try:
        assert one.url.startswith("memory://") and one.url != two.url
        assert await _act(one, "a") == 1
        assert await two.actions() == []  # not the same database
        assert [a.command for a in await one.actions()] == ["a"]
        assert (await one.verify()).ok
    finally:
        one.close()
        two.close()


async def test_a_named_memory_database_is_shared_until_the_last_engine_closes() -> None:
    url = memory_url("shared_test")
    first = open_store(url)
    second = open_store(url)
    try:
        await _act(first, "a")
        assert [a.command for a in await second.actions()] == ["a"]
    finally:
        first.close()
    try:
        assert [a.command for a in await second.actions()] == ["a"]  # still held by second
    finally:
        second.close()
    again = open_store(url)  # nobody held it: a new, empty database
    try:
        assert await again.actions() == []
    finally:
        again.close()


@pytest.mark.parametrize("url", ["memory://a/b", "memory://x y", "memory://" + "n" * 65])
def test_a_bad_memory_name_is_one_line(url: str) -> None:
    with pytest.raises(StoreError, match=r"not a memory database name: .*letters, digits"):
        open_store(url)


def test_an_unknown_database_names_memory_among_the_choices() -> None:
    with pytest.raises(
        StoreError, match=r"sqlite:///PATH, postgresql\+psycopg://\.\.\. or memory://"
    ):
        open_store("mysql://x/y")


async def test_a_copied_schema_is_the_migrated_one_triggers_included() -> None:
    first = open_store("memory://")  # migrated, or copied from the process's first
    copied = open_store("memory://")  # copied: no migration runs
    try:
        assert first.revision() == copied.revision() == (HEAD, HEAD)
        assert _tables(first) == _tables(copied)
        await _act(copied, "a")
        with (
            pytest.raises(sa.exc.DBAPIError, match="append-only"),
            copied.engine.begin() as conn,
        ):
            conn.exec_driver_sql("UPDATE audit_log SET actor = 'x'")
        assert (await copied.verify()).ok and await first.actions() == []
    finally:
        first.close()
        copied.close()


def _tables(store: Store) -> list[tuple[str, str]]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT type, name FROM sqlite_master ORDER BY name").all()
    return [(str(t), str(n)) for t, n in rows]
