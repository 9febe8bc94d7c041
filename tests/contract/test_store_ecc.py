"""The ECC counts the sweep's health checks keep (issue 27), on every database: stored rows
come back as written, a row is replaced, and a growth counts across a restart of gpubot."""

from __future__ import annotations

from gpubot.core.findings import Finding
from gpubot.core.health.findings import EccSeen
from gpubot.core.health.state import GpuHealth, NodeHealth
from gpubot.core.models import CommandResult, GpuInfo, NodeSnapshot
from gpubot.services.health_checks import HealthChecks, with_health
from gpubot.store import Store, open_store
from gpubot.transport.scripted import Call, ScriptedTransport


async def test_counts_round_trip_and_replace(store: Store) -> None:
    a, b = ("n1", "GPU-a", "volatile"), ("n1", "GPU-a", "aggregate")
    await store.ecc.put_ecc({a: EccSeen(3), b: EccSeen(9, 7, 1)})
    assert await store.ecc.ecc_counts() == {a: EccSeen(3), b: EccSeen(9, 7, 1)}
    await store.ecc.put_ecc({a: EccSeen(4, 3, 0)})
    assert await store.ecc.ecc_counts() == {a: EccSeen(4, 3, 0), b: EccSeen(9, 7, 1)}


def _never(call: Call) -> CommandResult:
    raise AssertionError(f"no node is asked here: {call}")


def _snap(count: int) -> NodeSnapshot:
    snap = NodeSnapshot("n1", 0.0, (GpuInfo(0, "GPU-a", "H100", 0, 1, 0),))
    return with_health(snap, NodeHealth({0: GpuHealth(0, ecc_volatile=count)}))


def grew(found: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in found if f.kind.value == "ecc-uncorrected"]


async def test_a_growth_is_seen_across_a_restart(fresh_db_url: str) -> None:
    first = open_store(fresh_db_url)
    try:
        before = HealthChecks(ScriptedTransport(_never), store=first.ecc)
        # the baseline, stored (a volatile count above 0 is its own finding, not growth)
        assert grew(await before.findings([_snap(2)], advance=True)) == []
    finally:
        first.close()
    again = open_store(fresh_db_url)  # a new process: nothing in memory
    try:
        after = HealthChecks(ScriptedTransport(_never), store=again.ecc)
        (f,) = grew(await after.findings([_snap(5)], advance=True))
        assert "volatile 2 → 5" in f.summary
        # control: without the store, the new process takes 5 for the baseline
        blind = HealthChecks(ScriptedTransport(_never))
        assert grew(await blind.findings([_snap(5)], advance=True)) == []
    finally:
        again.close()
