"""The unit tier's guard: a unit test starts no process, opens no socket, never sleeps for real.

The guard (``tests/fixtures/tier_guard.py``) is installed around each unit test's setup, call
and teardown by the hooks below, which pytest runs for the tests of this folder only, so broader
fixtures' setup is guarded too and a contract or integration test in the same run is not. The
autouse ``tier_guard`` fixture hands the guard to a test that must show it firing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager

import pytest

from tests.fixtures.skip_loop import SkipLoop
from tests.fixtures.tier_guard import TierGuard

GUARD = TierGuard()


@contextmanager
def checked(when: str) -> Iterator[None]:
    """Fail the phase with every violation recorded in it, even one the code under test caught."""
    try:
        yield
    except BaseException as exc:
        for v in GUARD.take():
            exc.add_note(v.line())
        raise
    taken = GUARD.take()
    if taken:
        lines = "\n".join(v.line() for v in taken)
        pytest.fail(f"{len(taken)} violation(s) of the unit tier during {when}:\n{lines}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    GUARD.take()
    GUARD.install()
    with checked("setup"):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with checked("the test"):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        with checked("teardown"):
            yield
    finally:
        GUARD.uninstall()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "skip_idle: run on a loop that skips its idle waits")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """A test marked ``skip_idle`` runs on a ``SkipLoop``: its sleeps and budgets cost no time."""
    if item.get_closest_marker("skip_idle") is not None:
        return {"skip_idle": SkipLoop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture(autouse=True)
def tier_guard() -> TierGuard:
    """The installed guard (``tier_guard.expect(rule)`` shows a rule firing)."""
    return GUARD
