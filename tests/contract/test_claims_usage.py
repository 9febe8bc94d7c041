"""The GPU-hours report counts a real claim from the claims' own rows: the store that the root
(``gpubot.app.services``) hands to ``UsageService`` is ``Store.claims``, on memory, SQLite and
PostgreSQL.

A claim of node3 GPU 0 for two hours, released after one, on a GPU nobody uses: dave's
claimed-but-unused time is the hour he held it, sweep by sweep; GPU 1, never claimed, counts
none. The control is the same history without the claims port: nothing is claimed.
"""

from __future__ import annotations

from gpubot.config import Settings
from gpubot.core.claims.rules import ClaimRequest, Granted
from gpubot.core.findings import SweepConfig
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.services.usage import UsageService
from gpubot.store import Store
from tests.fixtures.settings import ManualClock

H = 3600.0
STEP = 300.0
T0 = 1_900_000_000.0 - (1_900_000_000 % H)  # on the hour


def idle_node(at: float) -> NodeSnapshot:
    gpus = tuple(GpuInfo(g, f"GPU-{g:04d}", "H200", 5, 143771, 0, minor=g) for g in range(2))
    return NodeSnapshot("node3", at, gpus, ())


def claim() -> ClaimRequest:
    gpus = ((0, "GPU-0000"),)
    return ClaimRequest("node3", gpus, "dave", "U0DAVE", T0, T0 + 2 * H, "eval", "test")


async def _unused_ms(store: Store, *, with_claims: bool) -> dict[str, int]:
    settings = Settings(sweep=SweepConfig(interval_s=STEP))
    claims = store.claims if with_claims else None
    svc = UsageService(settings, store.usage, claims=claims)
    for i in range(1, 25):  # sweeps every 5 minutes for two hours
        at = T0 + i * STEP
        if at == T0 + H:
            await store.claims.release("U0DAVE", ("node3", ()), now=at, source="test")
        await svc.record([idle_node(at)], at)
    svc.clock = ManualClock(T0 + 3 * H)
    doc = (await svc.report("1d", None, by="user")).to_dict()
    rows = doc["rows"]
    assert isinstance(rows, list)
    return {str(r["user"]): int(r["unused_ms"]) for r in rows if r.get("unused_ms")}


async def test_a_real_claim_counts_as_claimed_but_unused(store: Store) -> None:
    assert isinstance(await store.claims.claim(claim()), Granted)
    # Sweeps at 5, 10, ... 55 minutes fall inside the claim; the one at 60 sees it released.
    assert await _unused_ms(store, with_claims=True) == {"dave": int(11 * STEP * 1000)}


async def test_control_without_the_claims_port_nothing_is_claimed(store: Store) -> None:
    assert isinstance(await store.claims.claim(claim()), Granted)
    assert await _unused_ms(store, with_claims=False) == {}
