"""``services.status.fan_out``: one call per node, bounded, each node failing alone, in a budget."""

from __future__ import annotations

import asyncio

import pytest

from gpubot.core.models import NodeConfig
from gpubot.errors import CommandTimeout, GpubotError, NodeUnreachable
from gpubot.services.status import fan_out

NODES = tuple(NodeConfig(f"n{i}", f"h{i}") for i in range(4))


# Budgets and sleeps on a loop that skips its idle waits: no wall time passes.
pytestmark = pytest.mark.skip_idle


async def test_each_node_fails_alone_and_in_node_order() -> None:
    async def call(node: NodeConfig) -> str:
        if node.name == "n1":
            raise NodeUnreachable(node.name, "connection refused")
        if node.name == "n2":
            raise KeyError("a bug")
        await asyncio.sleep(0.01 if node.name == "n0" else 0)
        return node.host

    res = await fan_out(NODES, call, 2)
    assert list(res.ok.items()) == [("n0", "h0"), ("n3", "h3")]
    assert list(res.failed) == ["n1", "n2"]
    assert str(res.failed["n1"]) == "n1: connection refused"
    assert type(res.failed["n2"]) is GpubotError and "internal error: KeyError" in str(
        res.failed["n2"]
    )


async def test_at_most_limit_calls_at_once() -> None:
    running, most = 0, 0

    async def call(node: NodeConfig) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    await fan_out(NODES, call, 2)
    assert most == 2


async def test_a_node_past_the_budget_times_out_and_the_others_answer() -> None:
    async def call(node: NodeConfig) -> str:
        await asyncio.sleep(30 if node.name == "n3" else 0)
        return node.name

    res = await fan_out(NODES, call, 1, budget_s=0.2, budget_name="sweep budget")
    assert list(res.ok) == ["n0", "n1", "n2"]
    (late,) = res.failed.values()
    assert isinstance(late, CommandTimeout) and isinstance(late, TimeoutError)
    assert str(late) == "n3: no answer within the sweep budget (0.2 s)"


async def test_a_nodes_own_timeout_is_not_the_budgets() -> None:
    async def call(node: NodeConfig) -> str:
        raise CommandTimeout(node.name, "nvidia-smi did not answer in 5 s")

    res = await fan_out(NODES[:1], call, 1, budget_s=10)
    assert str(res.failed["n0"]) == "n0: nvidia-smi did not answer in 5 s"


async def test_cancellation_is_not_a_node_failure() -> None:
    async def call(node: NodeConfig) -> str:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await fan_out(NODES[:1], call, 1)


async def test_a_large_fleet_is_limit_tasks_not_one_per_node() -> None:
    """2,000 nodes once meant 2,000 tasks whose first steps ran in one turn of the loop."""
    nodes = tuple(NodeConfig(f"n{i}", f"h{i}") for i in range(300))
    before = len(asyncio.all_tasks())
    most = 0

    async def call(node: NodeConfig) -> str:
        nonlocal most
        most = max(most, len(asyncio.all_tasks()) - before)
        await asyncio.sleep(0)
        return node.name

    res = await fan_out(nodes, call, 4, budget_s=30)
    assert list(res.ok) == [n.name for n in nodes]  # every node, in node order
    assert most == 4


async def test_nodes_not_reached_within_the_budget_time_out_in_node_order() -> None:
    async def call(node: NodeConfig) -> str:
        await asyncio.sleep(0.15)
        return node.name

    res = await fan_out(NODES, call, 1, budget_s=0.2, budget_name="sweep budget")
    assert list(res.ok) == ["n0"]
    assert list(res.failed) == ["n1", "n2", "n3"]  # n2 and n3 never got a turn
    assert all(
        str(e).endswith("no answer within the sweep budget (0.2 s)") for e in res.failed.values()
    )
