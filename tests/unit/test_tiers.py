"""The unit tier's guard is installed, fires for a process, a socket and a sleep, and lets the
event loop's own machinery through."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.tier_guard import TierGuard
from tests.unit.conftest import GUARD, checked


def test_the_guard_is_installed_for_every_unit_test(request: pytest.FixtureRequest) -> None:
    # This test asks for no fixture: the guard is there because the hooks installed it around
    # every unit test, and its fixture is autouse.
    assert GUARD.installed
    assert time.sleep.__qualname__.startswith("TierGuard.")
    assert "tier_guard" in request.fixturenames


def test_a_process_fails_the_test(tier_guard: TierGuard) -> None:
    with tier_guard.expect("process"):
        subprocess.run(["true"], check=True)
    with tier_guard.expect("process"):
        os.system("true")  # refused by the guard before any shell runs: that is the test
    with tier_guard.expect("process"):
        os.fork()


async def test_an_asyncio_process_fails_the_test(tier_guard: TierGuard) -> None:
    with tier_guard.expect("process"):
        await asyncio.create_subprocess_exec("true")
    with tier_guard.expect("process"):
        await asyncio.create_subprocess_shell("true")  # refused before a shell runs


def test_a_socket_fails_the_test(tier_guard: TierGuard) -> None:
    for family, address in ((socket.AF_INET, ("127.0.0.1", 0)), (socket.AF_UNIX, "\0guard")):
        with socket.socket(family) as s, tier_guard.expect("socket"):
            s.bind(address)
    with socket.socket() as s, tier_guard.expect("socket"):
        s.connect(("127.0.0.1", 9))


async def test_an_asyncio_connection_or_server_fails_the_test(tier_guard: TierGuard) -> None:
    with tier_guard.expect("socket"):
        await asyncio.open_connection("127.0.0.1", 9)
    with tier_guard.expect("socket"):
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)


async def test_a_wall_clock_sleep_fails_the_test(tier_guard: TierGuard) -> None:
    with tier_guard.expect("sleep"):
        time.sleep(0.001)
    with tier_guard.expect("sleep"):
        await asyncio.sleep(0.001)


async def test_a_zero_sleep_is_allowed(tier_guard: TierGuard) -> None:
    # Controls: yielding to the loop waits for nothing, so the guard lets it through.
    await asyncio.sleep(0)
    time.sleep(0)
    assert tier_guard.violations == []


def test_a_new_event_loop_and_a_socketpair_are_allowed(tier_guard: TierGuard) -> None:
    # Controls: a fresh loop's self-pipe is a socketpair, neither bound nor connected.
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    a, b = socket.socketpair()
    a.close()
    b.close()
    assert tier_guard.violations == []


def test_a_caught_violation_still_fails_its_phase(tier_guard: TierGuard) -> None:
    # Code under test that swallows the failure does not hide it: it stays recorded, and the
    # phase fails when it ends, naming the rule and the line.
    caught = pytest.raises(
        pytest.fail.Exception, match=r"during the test:\n.*sleep rule.*test_tiers"
    )
    with caught, checked("the test"), contextlib.suppress(BaseException):
        time.sleep(0.001)  # the suppress is a caller that swallows everything
    assert tier_guard.violations == []
    with checked("the test"):  # the control: nothing recorded, nothing raised
        time.sleep(0)


@pytest.mark.skip_idle
async def test_a_sleep_on_a_loop_that_skips_its_idle_waits_is_allowed(
    tier_guard: TierGuard,
) -> None:
    # The loop moves its own time on instead of waiting: half a minute of it, no wall time.
    loop = asyncio.get_running_loop()
    start, wall = loop.time(), time.monotonic()
    await asyncio.sleep(30)
    assert loop.time() - start >= 30 and time.monotonic() - wall < 5
    assert tier_guard.violations == []


def test_no_test_module_imports_another() -> None:
    # Shared helpers live in tests/fixtures: importing a test module runs its module code and
    # its fixtures in another file, and renaming one test breaks distant ones.
    tests = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.relative_to(tests)}: {name}"
                for name in names
                if name.split(".")[-1].startswith("test_") and name.startswith("tests.")
            ]
    assert found == []
