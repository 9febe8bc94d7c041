"""``core.admission``: fewer nodes in flight while the loop's own work fills its turns."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpubot.core import admission
from gpubot.core.admission import Admission
from gpubot.core.models import NodeConfig
from gpubot.services.status import fan_out

NODES = tuple(NodeConfig(f"n{i}", f"h{i}") for i in range(300))


# Budgets and sleeps on a loop that skips its idle waits: no wall time passes.
pytestmark = pytest.mark.skip_idle


def burn(seconds: float) -> None:
    """Hold the loop for ``seconds`` of this thread's CPU (whatever else the box runs)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class InFlight:
    """Counts calls in flight, and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def __enter__(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


async def test_answers_that_take_long_get_every_place() -> None:
    """Latency-bound (a real network, a slow probe): the loop idles, all 32 places are used."""
    seen = InFlight()

    async def call(node: NodeConfig) -> str:
        with seen:
            await asyncio.sleep(0.05)
        return node.host

    res = await fan_out(NODES, call, 32)
    assert len(res.ok) == len(NODES)
    assert seen.most == 32


async def loop_bound(limit: int) -> InFlight:
    """A round whose answers are all work on the loop: 3 steps of 1 ms of CPU a node."""
    seen = InFlight()

    async def call(node: NodeConfig) -> None:
        with seen:
            for _ in range(3):
                await asyncio.sleep(0)
                burn(0.001)

    res = await fan_out(NODES, call, limit)
    assert len(res.ok) == len(NODES)
    return seen


async def test_answers_that_are_work_on_the_loop_get_fewer_places(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loop-bound: 64 in flight make turns of 64 ms; admitted, the turns stay near 16."""
    assert (await loop_bound(64)).most <= admission.FLOOR + 2
    monkeypatch.setattr(admission, "FLOOR", 10**6)  # the control: every place from the start
    assert (await loop_bound(64)).most == 64


def test_a_busy_window_cuts_places_a_calm_one_adds_some() -> None:
    gate = Admission(64, floor=16)
    assert gate.places == 16  # from the floor up
    gate.saw(0.001)
    assert gate.places == 18  # an eighth more
    for _ in range(100):
        gate.saw(0.001)
    assert gate.places == gate.most == 64
    gate.saw(0.015)  # neither: as it was
    assert gate.places == 64
    gate.saw(0.030)
    assert gate.places == int(64 * admission.CUT)
    for _ in range(20):
        gate.saw(0.030)
    assert gate.places == 16  # never under the floor
    assert Admission(4, floor=16).places == 4  # nor over the limit


async def test_a_freed_place_goes_to_the_first_waiter_and_a_cancelled_one_passes_it_on() -> None:
    gate = Admission(1, floor=1)
    order: list[str] = []
    hold = asyncio.Event()

    async def job(name: str) -> None:
        async with gate.place():
            order.append(name)
            await hold.wait()

    first = asyncio.ensure_future(job("a"))
    await asyncio.sleep(0)
    b, c = (asyncio.ensure_future(job(n)) for n in ("b", "c"))
    await asyncio.sleep(0)
    assert order == ["a"] and gate.running == 1
    hold.set()
    await asyncio.sleep(0)  # a leaves: its place is b's, and b has not run yet
    assert first.done() and not b.done()
    b.cancel()  # b gives up holding it: c gets it, not nobody
    await asyncio.wait_for(asyncio.gather(b, c, return_exceptions=True), 5)
    assert b.cancelled() and order == ["a", "c"] and gate.running == 0


async def test_whoever_frees_a_place_waits_behind_those_already_waiting() -> None:
    """A worker takes its next node at once after its last: it must not take the place it just
    freed past a waiter (the control, a place re-checked by whoever runs first, lets it)."""
    gate = Admission(1, floor=1)
    order: list[str] = []
    hold = asyncio.Event()

    async def worker(name: str, rounds: int) -> None:
        for i in range(rounds):
            async with gate.place():
                order.append(f"{name}{i}")
                await hold.wait()

    a = asyncio.ensure_future(worker("a", 2))
    await asyncio.sleep(0)
    b = asyncio.ensure_future(worker("b", 1))
    await asyncio.sleep(0)
    hold.set()
    await asyncio.wait_for(asyncio.gather(a, b), 5)
    assert order == ["a0", "b0", "a1"]
