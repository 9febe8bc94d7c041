"""A Keep clicked while the claims' duty looks at the node must stand: the idle release and the
idle run's write are conditional on the row the duty read (review of issue 26)."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.core.claims.rules import ClaimSettings, ClaimState, Granted
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.errors import StoreError
from gpubot.services.claim_idle import IdleAsked, IdleReleased, idle_claims
from gpubot.store import Store
from tests.fixtures.claim_requests import T0, req

CONFIG = ClaimSettings(enabled=True, claim_idle_minutes=10, every_s=600)


class KeepWhileLooking:
    """A status whose probe takes a while; the holder clicks Keep meanwhile (``keep_at``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keep_at: float | None = None

    def node(self, name: str) -> str:
        return name

    async def snapshot(self, node: Any) -> NodeSnapshot:
        if self.keep_at is not None:  # the click lands while the duty waits for the node
            assert await self.store.claims.keep(1, "U1", self.keep_at, "slack") is not None
        gpu = GpuInfo(2, "GPU-0002", "H100", 0, 81559, 0)
        return NodeSnapshot("node3", T0, (gpu,))


@pytest.mark.parametrize("kept", [True, False])
async def test_a_keep_during_the_duty_is_not_released(store: Store, kept: bool) -> None:
    got = await store.claims.claim(req("U1", (2,), end=T0 + 86400))
    assert isinstance(got, Granted)
    status = KeepWhileLooking(store)
    events: list[Any] = []
    for k in range(4):  # looks every 10 min: asked at 10 min, due for release at 20 min
        status.keep_at = T0 + 1200 if kept and k == 2 else None
        events += await idle_claims(CONFIG, store.claims, status, T0 + 600 * k)  # type: ignore[arg-type]
    released = [e for e in events if isinstance(e, IdleReleased)]
    asked = [e for e in events if isinstance(e, IdleAsked)]
    if not kept:  # the control: nobody kept it, so the idle rule releases it
        assert [e.claim.id for e in released] == [1] and len(asked) == 1
        assert await store.claims.active("node3") == []
        return
    assert not released
    assert len(asked) == 1  # the run started anew at the Keep: not asked again 10 min later
    (c,) = await store.claims.active("node3")
    assert c.state is ClaimState.ACTIVE and c.idle_dm_at is None


class RunsNotStored:
    """The claims' store, whose idle runs cannot be written this once."""

    def __init__(self, store: Store) -> None:
        self.claims = store.claims

    def __getattr__(self, name: str) -> Any:
        return getattr(self.claims, name)

    async def advance_idle(self, updates: Any) -> None:
        raise StoreError("database is locked")


async def test_an_ask_recorded_is_told_though_the_idle_runs_are_not_stored(store: Store) -> None:
    """Asked in the database but never told, a holder would lose the claim a period later
    without a word; the failure of the runs' write must not swallow the ask."""
    got = await store.claims.claim(req("U1", (2,), end=T0 + 86400))
    assert isinstance(got, Granted)
    status = KeepWhileLooking(store)
    assert await idle_claims(CONFIG, store.claims, status, T0) == []  # type: ignore[arg-type]
    flaky = RunsNotStored(store)
    events = await idle_claims(CONFIG, flaky, status, T0 + 600)  # type: ignore[arg-type]
    assert [type(e) for e in events] == [IdleAsked]
    (c,) = await store.claims.active("node3")
    assert c.idle_dm_at == T0 + 600  # the ask is recorded: and the holder is told of it
