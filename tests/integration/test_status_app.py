"""``gpubot status``'s composition: the audit store opens in a worker thread while the body (the
probe) runs; its failures keep their old meaning, whichever of the two finishes first."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

import gpubot.app.root as app_module
from gpubot.app import App, build
from gpubot.config import Settings, load
from gpubot.errors import DatabaseBehind, UsageError

QUERY: dict[str, Any] = {
    "kind": "status",
    "actor": "cli:t",
    "source": "cli",
    "nodes": ["n1"],
    "failed": {},
    "seconds": 0.5,
}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n\n'
        '[[nodes]]\nname = "n1"\nhost = "127.0.0.1"\nport = 9\n'
    )
    return load(path)


class FakeStore:
    def __init__(self) -> None:
        self.recorded: list[dict[str, Any]] = []
        self.closed = False

    async def record_query(self, **query: Any) -> None:
        self.recorded.append(query)

    def close(self) -> None:
        self.closed = True


class Opening:
    """Stands in for ``app._store``: takes ``delay_s`` in its thread, then returns or raises."""

    def __init__(self, result: object, delay_s: float = 0.2) -> None:
        self.result, self.delay_s = result, delay_s
        self.body_started_first: bool | None = None
        self.thread: str | None = None
        self.started = threading.Event()

    def __call__(self, settings: Settings, environ: object, need_store: bool) -> object:
        assert need_store is False  # status warns on a database it cannot use
        self.thread = threading.current_thread().name
        self.body_started_first = self.started.is_set()
        time.sleep(self.delay_s)
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def body_recording(opening: Opening, answered: list[str]) -> Any:
    async def body(app: App) -> int:
        opening.started.set()
        assert app.opening is not None
        await app.opening.record_query(**QUERY)  # what the status service does after the probe
        answered.append("answered")
        return 7

    return body


async def run(settings: Settings, opening: Opening, body: Any) -> tuple[App, int]:
    app = build(settings, {}, need_store=False, cold=True)
    try:
        return app, await app.run(body)
    finally:
        await app.close()


async def test_the_body_starts_first_and_its_query_is_recorded_once_the_store_is_open(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    opening = Opening(store)
    monkeypatch.setattr(app_module, "store_or_warn", opening)
    answered: list[str] = []
    app, code = await run(settings, opening, body_recording(opening, answered))
    assert code == 7 and answered == ["answered"]
    assert store.recorded == [QUERY] and app.store is cast(object, store)
    assert opening.body_started_first is True  # the probe goes out before the store opens
    assert opening.thread != threading.current_thread().name
    assert store.closed


async def test_a_store_that_cannot_be_used_records_nothing_and_the_body_answers(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening = Opening(None)  # the real ``_store`` has warned and returned None
    monkeypatch.setattr(app_module, "store_or_warn", opening)
    answered: list[str] = []
    app, code = await run(settings, opening, body_recording(opening, answered))
    assert code == 7 and answered == ["answered"] and app.store is None


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
async def test_a_database_behind_stops_the_body_before_it_answers(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, delay_s: float
) -> None:
    opening = Opening(DatabaseBehind("database is at 0002"), delay_s)
    monkeypatch.setattr(app_module, "store_or_warn", opening)
    answered: list[str] = []
    with pytest.raises(DatabaseBehind, match="0002"):
        await run(settings, opening, body_recording(opening, answered))
    assert answered == []


async def test_a_database_behind_wins_over_the_body_failing_first(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening = Opening(DatabaseBehind("database is at 0002"))
    monkeypatch.setattr(app_module, "store_or_warn", opening)

    async def body(app: App) -> int:
        raise UsageError("unknown node or group 'nodeX'")

    with pytest.raises(DatabaseBehind):  # as when the store was opened before anything else
        await run(settings, opening, body)


async def test_the_body_failing_is_raised_once_the_store_is_open_and_closed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    opening = Opening(store)
    monkeypatch.setattr(app_module, "store_or_warn", opening)

    async def body(app: App) -> int:
        raise UsageError("unknown node or group 'nodeX'")

    with pytest.raises(UsageError):
        await run(settings, opening, body)
    assert store.recorded == [] and store.closed
