"""The descriptor budget (``core.fdbudget``) and the SSH pool's cap (``transport.pool_cap``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpubot.core import fdbudget as fb
from gpubot.errors import NodeUnreachable
from gpubot.transport.pool_cap import ConnectionCap


@pytest.mark.parametrize(
    ("soft", "hard", "to"),
    [
        (1024, 524288, 524288),  # systemd's defaults: raised to the hard limit
        (1024, 1024, 1024),  # nothing to raise
        (1024, None, fb.UNLIMITED_TARGET),  # unlimited hard: fs.nr_open's default
        (2_000_000, None, 2_000_000),  # never lowered
        (4096, 2048, 4096),
    ],
)
def test_raised_to(soft: int, hard: int | None, to: int) -> None:
    assert fb.raised_to(soft, hard) == to


@pytest.mark.parametrize(
    ("soft", "cap"),
    [(1, 1), (64, 1), (100, 36), (512, 448), (1024, 896), (4096, 3584), (524288, 458752)],
)
def test_connection_cap_leaves_headroom(soft: int, cap: int) -> None:
    assert fb.connection_cap(soft) == cap
    assert soft - cap >= min(soft - 1, fb.RESERVE)


@pytest.mark.parametrize("nodes", [1, 100, 896, 897, 1014, 1500, 2000, 100_000])
def test_needed_is_the_smallest_limit_for_a_fleet(nodes: int) -> None:
    soft = fb.needed(nodes)
    assert fb.connection_cap(soft) >= nodes
    assert soft == 1 or fb.connection_cap(soft - 1) < nodes


@pytest.mark.parametrize(
    ("nodes", "soft", "said"),
    [
        (512, 1024, None),
        (896, 1024, None),
        (
            1500,
            1024,
            "1500 nodes but the descriptor limit (1024) allows 896 SSH connections: idle ones are "
            "closed and reopened as needed (slower); raise LimitNOFILE to at least 1714 to keep "
            "one per node",
        ),
        (1500, 524288, None),
    ],
)
def test_fleet_line(nodes: int, soft: int, said: str | None) -> None:
    assert fb.fleet_line(nodes, soft) == said


@pytest.mark.parametrize(
    ("before", "after", "hard", "said"),
    [
        (
            1024,
            524288,
            524288,
            "descriptor limit: soft raised from 1024 to 524288, hard 524288: up to 458752 SSH "
            "connections at once",
        ),
        (
            1024,
            1024,
            1024,
            "descriptor limit: soft left at 1024 (the hard limit), hard 1024: up to 896 SSH "
            "connections at once",
        ),
        (
            1024,
            1024,
            None,
            "descriptor limit: soft left at 1024, hard unlimited: up to 896 SSH connections "
            "at once",
        ),
    ],
)
def test_raised_line(before: int, after: int, hard: int | None, said: str) -> None:
    assert fb.raised_line(before, after, hard) == said


async def test_the_cap_closes_the_least_recently_used_idle_connection() -> None:
    closed: list[str] = []
    cap = ConnectionCap(2, closed.append)
    for n in ("a", "b", "a"):  # a used last: b gives way
        async with cap.held(n, 1):
            pass
    async with cap.held("c", 1):
        assert closed == ["b"]
        async with cap.held("a", 1):  # a has its place still
            pass
    assert closed == ["b"] and cap.closed_for_room == 1


@pytest.mark.skip_idle  # the pool's wait and the release run on loop time, not wall time
async def test_a_busy_connection_is_never_closed_and_a_full_pool_waits_then_says_why() -> None:
    closed: list[str] = []
    cap = ConnectionCap(1, closed.append)
    release = asyncio.Event()

    async def busy() -> None:
        async with cap.held("a", 1):
            await release.wait()

    task = asyncio.create_task(busy())
    await asyncio.sleep(0)
    with pytest.raises(NodeUnreachable, match="no SSH connection free: all 1 that the descriptor"):
        async with cap.held("b", 0.05):
            pass
    assert closed == []

    async def later() -> None:
        await asyncio.sleep(0.05)
        release.set()

    asyncio.get_running_loop().create_task(later())
    async with cap.held("b", 5):  # waits for a's command to end, then takes its place
        assert closed == ["a"]
    await task


def test_the_app_says_at_build_when_the_fleet_outgrows_the_limit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpubot.app import build
    from gpubot.config import Settings
    from gpubot.core.models import NodeConfig
    from gpubot.transport import descriptors, make_transport

    monkeypatch.setattr(descriptors, "limits", lambda: (1024, 1024))
    with caplog.at_level(logging.WARNING, logger="gpubot.transport.descriptors"):
        make_transport(Settings().ssh, 10)
        assert caplog.records == []  # control: a fleet the limit allows is not mentioned
        nodes = tuple(NodeConfig(name=f"n{i}", host=f"h{i}") for i in range(1500))
        build(Settings(nodes=nodes), {}, need_store=False, cold=True)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("1500 nodes but the descriptor limit (1024) allows")
