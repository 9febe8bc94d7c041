"""``gpubot serve --chat both`` runs two listeners: one that fails stops the other, which ends,
drained, before the failure is raised (and the apps close)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gpubot.cli.serve import listen_all
from gpubot.errors import ConfigError


async def test_one_failing_stops_the_other_which_drains_before_the_failure_is_raised() -> None:
    said: list[str] = []

    async def slack(stop: asyncio.Event) -> None:
        raise ConfigError("cannot serve Slack on 127.0.0.1:3000: Address already in use")

    async def matrix(stop: asyncio.Event) -> None:
        await stop.wait()
        for _ in range(5):  # a command under way finishes: several turns of the loop
            await asyncio.sleep(0)
        said.append("drained")

    with pytest.raises(ConfigError, match="cannot serve Slack"):
        await listen_all([slack, matrix], asyncio.Event())
    assert said == ["drained"]


async def test_a_stop_ends_both_and_raises_nothing() -> None:
    ended: list[str] = []
    stop = asyncio.Event()

    def listener(name: str) -> Callable[[asyncio.Event], Awaitable[None]]:
        async def listen(s: asyncio.Event) -> None:
            await s.wait()
            ended.append(name)

        return listen

    stop.set()  # SIGTERM
    await listen_all([listener("slack"), listener("matrix")], stop)
    assert sorted(ended) == ["matrix", "slack"]
