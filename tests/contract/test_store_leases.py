"""Leases with fencing tokens (``store.leases``), the same on SQLite and PostgreSQL: a live lease
refuses a second holder, renewal keeps it past its ttl, an expired lease of a dead holder is taken
over (audited), and the old holder's fenced writes are refused from then on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gpubot.core.lease import Lease
from gpubot.errors import LeaseLost, LockHeld
from gpubot.store import Store
from gpubot.store import leases as leases_mod
from gpubot.store.engine import write_tx
from gpubot.store.leases import DbLeases
from tests.fixtures.db import audit_rows

NODE = "reset:node3"


def _row(store: Store, resource: str = NODE) -> sa.Row[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT holder, token, since, expires_at FROM leases WHERE resource = :r"),
            {"r": resource},
        ).one()


def _expire(store: Store, resource: str = NODE) -> None:
    """Make the lease run out now, as if its holder had stopped renewing a ttl ago."""
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat(timespec="microseconds")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE leases SET expires_at = :t WHERE resource = :r"),
            {"t": past.replace("+00:00", "Z"), "r": resource},
        )


async def test_a_live_lease_refuses_a_second_holder_and_tokens_only_grow(
    store: Store, fresh_db_url: str
) -> None:
    a = DbLeases(store.engine, replica="hostA:1", ttl_s=30, renew_s=5)
    b = DbLeases(store.engine, replica="hostB:2", ttl_s=30, renew_s=5)
    async with a.hold(NODE, holder="slack:U0BOB") as lease:
        assert (lease.token, lease.holder) == (1, "hostA:1 slack:U0BOB")
        with pytest.raises(LockHeld) as exc:
            async with b.hold(NODE):
                pytest.fail("two holders")
        assert str(exc.value).startswith(
            "reset:node3 is busy: held by hostA:1 slack:U0BOB since 20"
        )
        async with b.hold("reset:node4") as other:  # another node is another lease
            assert other.token == 1
    assert _row(store).holder == ""  # released: the row stays, with its token
    async with b.hold(NODE) as again:
        assert again.token == 2 and again.took_over is None  # a release is no takeover
    assert [r.kind for r in audit_rows(fresh_db_url)] == []  # nothing to audit


async def test_renewal_keeps_a_lease_past_its_ttl(store: Store) -> None:
    # A ttl of 2 s: a renewal may be late by well over a second on a loaded box (1 s was not
    # enough in CI) and the lease still holds.
    a = DbLeases(store.engine, replica="A", ttl_s=2.0, renew_s=0.2)
    b = DbLeases(store.engine, replica="B", ttl_s=2.0, renew_s=0.2)
    async with a.hold(NODE) as lease:
        for _ in range(3):  # 6 s: three ttls
            await asyncio.sleep(2.0)
            with pytest.raises(LockHeld):
                async with b.hold(NODE):
                    pass
        assert lease.lost is None and lease.renewals >= 5


async def test_without_renewal_the_lease_runs_out(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: with renewal taken away, the ttl decides."""

    async def no_renewal(self: DbLeases, lease: Lease) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(DbLeases, "_renew", no_renewal)
    a = DbLeases(store.engine, replica="A", ttl_s=1.0, renew_s=0.2)
    b = DbLeases(store.engine, replica="B", ttl_s=1.0, renew_s=0.2)
    async with a.hold(NODE):
        await asyncio.sleep(1.5)
        async with b.hold(NODE) as taken:  # A still runs, but its lease ran out
            assert taken.token == 2 and taken.took_over is not None


async def test_a_dead_holders_expired_lease_is_taken_over_and_its_fence_fails(
    store: Store, fresh_db_url: str
) -> None:
    a = DbLeases(store.engine, replica="hostA:1", ttl_s=30, renew_s=5)
    b = DbLeases(store.engine, replica="hostB:2", ttl_s=30, renew_s=5)
    async with a.hold(NODE) as old:
        fence = old.fence
        assert fence is not None
        action = await store.begin_action(
            kind="reset",
            actor="t",
            source="t",
            command="c",
            node="node3",
            gpus=[0],
            plan={},
            fence=fence,
        )
        await store.record_event(action, {"kind": "planned"}, fence=fence)
        _expire(store)  # A stopped renewing (died, or lost the database past its ttl)
        async with b.hold(NODE, holder="slack:U0ALICE") as new:
            assert new.token == old.token + 1
            assert new.took_over is not None and new.took_over["holder"] == "hostA:1"
            before = len(audit_rows(fresh_db_url))
            with pytest.raises(
                LeaseLost, match="lost the node lease: another gpubot may be acting on node3"
            ):
                await store.record_event(action, {"kind": "sending"}, fence=fence)
            with pytest.raises(LeaseLost):
                await store.finish_action(action, status="freed", result={}, fence=fence)
            assert len(audit_rows(fresh_db_url)) == before  # nothing was written
            # Control: the same write without the fence goes through (the fence refused it).
            await store.record_event(action, {"kind": "sending"})
            assert len(audit_rows(fresh_db_url)) == before + 1
            # The old holder's release leaves the new holder's lease alone.
        assert _row(store).holder == ""  # B released at the end of its block
    took = [r for r in audit_rows(fresh_db_url) if r.kind == "lease"]
    assert len(took) == 1 and took[0].node == "node3" and took[0].actor == "hostB:2 slack:U0ALICE"
    assert took[0].data["took_over"]["holder"] == "hostA:1"
    assert "which never released it" in took[0].data["note"]
    assert (await store.verify()).ok


async def test_a_holder_whose_renewal_finds_the_lease_gone_knows_it(store: Store) -> None:
    a = DbLeases(store.engine, replica="A", ttl_s=30, renew_s=0.2)
    async with a.hold(NODE) as lease:
        fence = lease.fence
        assert fence is not None
        with write_tx(store.engine) as conn:  # another replica took it (its token moved on)
            conn.execute(sa.text("UPDATE leases SET token = token + 1, holder = 'B'"))
        for _ in range(50):
            if lease.lost is not None:
                break
            await asyncio.sleep(0.1)
        with pytest.raises(LeaseLost, match="lost the node lease"):
            lease.check()
    assert _row(store).holder == "B"  # A's release did not free B's lease


async def test_the_fence_checks_token_holder_and_expiry_together(store: Store) -> None:
    a = DbLeases(store.engine, replica="A", ttl_s=30, renew_s=5)
    async with a.hold(NODE) as lease:
        fence = lease.fence
        assert fence is not None
        now = datetime.now(UTC)
        with write_tx(store.engine) as conn:
            assert leases_mod.renew(conn, fence, now)
            for bad in (
                fence.__class__(fence.resource, fence.token + 1, fence.holder, fence.ttl_s),
                fence.__class__(fence.resource, fence.token, "B", fence.ttl_s),
                fence.__class__("reset:node4", fence.token, fence.holder, fence.ttl_s),
            ):
                assert not leases_mod.renew(conn, bad, now)
            assert not leases_mod.renew(conn, fence, now + timedelta(seconds=31))  # expired
