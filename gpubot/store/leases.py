"""Leases with fencing tokens in the database: one node's reset, the sweep (the ``Locks`` port).

A lease is a row taken, renewed and released by conditional writes inside ``engine.write_tx``:

- taking: a free or expired row becomes this holder's with ``token + 1``; a live one refuses at
  once (``LockHeld``). Taking over a dead holder's expired lease is audited in that transaction.
- renewing, and every fenced audit write: an update that names resource, token, holder and an
  unexpired time; no row updated means the lease is gone (``LeaseLost``).
- releasing: the lease expires now; the row and its token stay, so no token is handed out twice.

Unlike a session-level advisory lock, nothing depends on one connection staying up: a restart,
failover or dropped connection leaves the row as it was. Clock skew between replicas can only
make a lease look expired early: the taker gets a new token, and the old holder's next fenced
write fails, so it stops before its next signal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Update, and_, select

from gpubot.core.lease import Fence, Lease, lost_message
from gpubot.core.timefmt import iso as show
from gpubot.errors import DUTY_TURN, LeaseLost, LockHeld, StoreError
from gpubot.store.audit import append
from gpubot.store.engine import guard, write_tx
from gpubot.store.records import iso, parse_iso
from gpubot.store.tables import leases
from gpubot.store.waits import in_thread

log = logging.getLogger(__name__)


def check_fence(conn: Connection, fence: Fence, now: datetime) -> None:
    """Extend the lease ``fence`` names, in ``conn``'s transaction, or raise ``LeaseLost``."""
    if not renew(conn, fence, now):
        raise LeaseLost(fence.resource, lost_message(fence.resource))


def renew(conn: Connection, fence: Fence, now: datetime) -> bool:
    """Extend the lease if ``fence``'s holder still holds it unexpired; return whether it did."""
    until = iso(now + timedelta(seconds=fence.ttl_s))
    held = _held(fence).where(leases.c.expires_at > iso(now))
    return conn.execute(held.values(expires_at=until)).rowcount == 1


def take(conn: Connection, resource: str, holder: str, now: datetime, ttl_s: float) -> Lease:
    """Take ``resource`` for ``holder`` or raise ``LockHeld`` (run inside ``write_tx``)."""
    row = conn.execute(select(leases).where(leases.c.resource == resource)).one_or_none()
    until = now + timedelta(seconds=ttl_s)
    values = {"holder": holder, "since": iso(now), "expires_at": iso(until)}
    if row is None:
        conn.execute(leases.insert().values(resource=resource, token=1, **values))
        return Lease(resource, holder, 1, until.timestamp(), ttl_s)
    if row.holder and row.expires_at > iso(now):
        when = show(parse_iso(row.since))
        raise LockHeld(resource, f"{row.holder} since {when} (lease until {row.expires_at})")
    token = int(row.token) + 1
    changed = conn.execute(
        leases.update()
        .where(and_(leases.c.resource == resource, leases.c.token == row.token))
        .values(token=token, **values)
    )
    if changed.rowcount != 1:  # only possible if the write lock was not held
        raise StoreError(f"the lease {resource!r} changed while it was taken")
    lease = Lease(resource, holder, token, until.timestamp(), ttl_s)
    if row.holder:  # never released: its holder died or lost the database past its lease
        lease.took_over = {
            "holder": row.holder,
            "token": int(row.token),
            "since": row.since,
            "expired_at": row.expires_at,
        }
        _audit_takeover(conn, lease, now)
    return lease


def _audit_takeover(conn: Connection, lease: Lease, now: datetime) -> None:
    kind, _, name = lease.resource.partition(":")
    payload: dict[str, Any] = {
        "lease": lease.resource,
        "token": lease.token,
        "holder": lease.holder,
        "took_over": lease.took_over,
        "note": f"took over the expired lease of {lease.resource} from "
        f"{(lease.took_over or {}).get('holder')}, which never released it",
    }
    node = name if kind == "reset" and name else None
    append(
        conn,
        kind="lease",
        actor=lease.holder,
        source="gpubot",
        node=node,
        payload=payload,
        now=now,
    )


def release(conn: Connection, fence: Fence, now: datetime) -> bool:
    """Give the lease back if ``fence``'s holder still holds it; return whether it did."""
    return conn.execute(_held(fence).values(holder="", expires_at=iso(now))).rowcount == 1


def _held(fence: Fence) -> Update:
    """Return an update of the lease ``fence`` names, only while its holder holds it."""
    return leases.update().where(
        leases.c.resource == fence.resource,
        leases.c.token == fence.token,
        leases.c.holder == fence.holder,
    )


class DbLeases:
    """Named leases in the store's database (SQLite or PostgreSQL): the ``Locks`` port."""

    def __init__(
        self,
        engine: Engine,
        *,
        replica: str | None = None,
        ttl_s: float = 30.0,
        renew_s: float = 5.0,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        """Use ``engine`` (the store's: a takeover is audited with its key and head file)."""
        if not 0 < renew_s < ttl_s:
            raise ValueError(f"a lease renewed every {renew_s} s must last longer, not {ttl_s} s")
        self.engine = engine
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"  # host:pid
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.now: Callable[[], datetime] = now or (lambda: datetime.now(UTC))

    @asynccontextmanager
    async def hold(self, name: str, *, holder: str = "") -> AsyncIterator[Lease]:
        """Hold the lease ``name`` for the block (renewed meanwhile), or raise ``LockHeld``."""
        who = f"{self.replica} {holder}".strip()
        taking = asyncio.ensure_future(in_thread(self._take, name, who))
        try:
            lease = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the take still ends in its thread: give back what it got
            await asyncio.gather(taking, return_exceptions=True)
            got = None if taking.exception() is not None else taking.result().fence
            if got is not None:
                await in_thread(self._release, got)
            raise
        renewer = asyncio.create_task(self._renew(lease), name=f"lease {name}")
        try:
            yield lease
        finally:
            # Shielded: a cancelled holder still gives the lease back (else it runs out).
            await asyncio.shield(self._end(lease, renewer))

    def close(self) -> None:
        """Nothing to close: leases use the store's engine."""

    def _take(self, name: str, who: str) -> Lease:
        with guard(f"cannot take the lease {name!r}"), write_tx(self.engine) as conn:
            return take(conn, name, who, self.now(), self.ttl_s)

    def _renew_once(self, fence: Fence) -> bool:
        with guard(f"cannot renew the lease {fence.resource!r}"), write_tx(self.engine) as conn:
            return renew(conn, fence, self.now())

    def _release(self, fence: Fence) -> None:
        what = f"cannot release the lease {fence.resource!r}"
        try:
            with guard(what), write_tx(self.engine) as conn:
                release(conn, fence, self.now())
        except StoreError as exc:  # it runs out by itself
            log.warning("%s: it expires by itself within %g s", exc, self.ttl_s, extra=DUTY_TURN)

    async def _renew(self, lease: Lease) -> None:
        """Renew every ``renew_s`` until the lease is lost (or the block ends: cancelled)."""
        fence = lease.fence
        assert fence is not None
        failing = False
        while lease.lost is None:
            await asyncio.sleep(self.renew_s)
            asked = time.time()
            renewing = asyncio.ensure_future(in_thread(self._renew_once, fence))
            try:
                held = await asyncio.shield(renewing)
            except asyncio.CancelledError:  # the block ended: let the write end (its connection
                await asyncio.gather(renewing, return_exceptions=True)  # goes back to the pool)
                raise
            except StoreError as exc:
                if not failing:
                    log.warning("%s (retrying every %g s)", exc, self.renew_s)
                failing = True
                try:
                    lease.check(time.time())
                except LeaseLost as lost:
                    log.error("%s", lost)
                continue
            if not held:
                lease.mark_lost("its row names another holder or it expired")
                log.error("%s", lost_message(lease.resource))
                continue
            if failing:
                log.info("lease %s renewed again", lease.resource)
            failing = False
            lease.expires_at = asked + self.ttl_s
            lease.renewals += 1

    async def _end(self, lease: Lease, renewer: asyncio.Task[None]) -> None:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
        fence = lease.fence
        if fence is not None:  # conditional: a lease taken over meanwhile is left alone
            await in_thread(self._release, fence)
