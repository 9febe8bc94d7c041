"""GPU claims on the database: conditional writes, every change audited.

Writes hold the database-wide write lock, so the check for a conflicting claim and the insert
are one step across replicas and the CLI: two people who claim one GPU at once get one winner.
The unique ``holding`` column is the database's own backstop. Each change appends its audit
record in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from gpubot.core.claims.rules import (
    Claim,
    ClaimOutcome,
    ClaimRequest,
    ClaimState,
    Conflict,
    Granted,
    OverLimit,
)
from gpubot.store import claim_waits as waits
from gpubot.store.claim_idle import IdleMixin
from gpubot.store.claim_rows import at, record, unix
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.tables import claims
from gpubot.store.waits import in_thread

Interval = tuple[str, int, str, float, float]  # node, gpu, user, start, end


class DbClaims(waits.WaitsMixin, IdleMixin):
    """Claims and the queue; every method is async and raises ``StoreError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def claim(self, req: ClaimRequest) -> ClaimOutcome:
        """Write the claim if no one else claims or holds those GPUs and no limit is passed."""
        return await in_thread(self._claim, req)

    async def extend(
        self, chat_id: str, scope: tuple[str | None, tuple[int, ...]], by_s: float, **kw: Any
    ) -> list[tuple[Claim, bool]]:
        """Extend ``chat_id``'s active claims in ``scope``; each with whether a limit cut it."""
        return await in_thread(self._extend, chat_id, scope, by_s, kw)

    async def release(
        self, chat_id: str | None, scope: tuple[str | None, tuple[int, ...]], **kw: Any
    ) -> list[Claim]:
        """Release active claims in ``scope`` (``chat_id`` None: whoever's); ``asked_before``:
        only those asked Keep / Release by then and not kept, checked in the same transaction."""
        return await in_thread(self._release, chat_id, scope, kw)

    async def expire(self, now: float, source: str = "gpubot") -> list[Claim]:
        """Expire the active claims whose time ran out; return those this call expired."""
        return await in_thread(self._expire, now, source)

    async def active(self, node: str | None = None) -> list[Claim]:
        """Return the active claims (of ``node``), by node and GPU."""
        return await in_thread(self._active, node)

    async def get(self, claim_id: int) -> Claim | None:
        """Return one claim."""
        return await in_thread(self._get, claim_id)

    async def used_last(self, chat_id: str, node: str) -> dict[int, float]:
        """Return GPU → when ``chat_id``'s last claim of it on ``node`` began."""
        return await in_thread(self._used_last, chat_id, node)

    def intervals(self, since: float, until: float) -> Iterable[Interval]:
        """Return (node, gpu, user, start, end) of every claim overlapping [since, until), cut
        to it (synchronous: call it in a worker thread)."""
        lo, hi = since, until
        with guard("cannot read claims"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(claims).where(claims.c.started_at < at(until)).order_by(claims.c.id)
            ).all()
        out: list[Interval] = []
        for r in rows:
            c = _claim(r)
            end = min(c.end, c.ended_at if c.ended_at is not None else c.end)
            if end > lo and c.start < hi:
                out.append((c.node, c.gpu, c.user, max(c.start, lo), min(end, hi)))
        return out

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _claim(self, req: ClaimRequest) -> ClaimOutcome:
        wanted = [g for g, _ in req.gpus]
        with guard("cannot record the claim, so nothing was claimed"), write_tx(self._engine) as c:
            held = [
                x
                for x in (_claim(r) for r in _active_rows(c, req.node))
                if x.gpu in wanted and x.chat_id != req.chat_id
            ]
            mine_held = [
                x
                for x in (_claim(r) for r in _active_rows(c, req.node))
                if x.gpu in wanted and x.chat_id == req.chat_id
            ]
            holds = waits.holding(c, req.node, wanted, req.start, but=req.wait_id)
            if held or holds or mine_held:
                return Conflict(tuple(held or mine_held), tuple(holds))
            mine = [_claim(r) for r in _active_rows(c, None) if r.chat_id == req.chat_id]
            for limit in req.limits:
                have = sum(1 for x in mine if limit.nodes is None or x.node in limit.nodes)
                if have + len(wanted) > limit.most:
                    return OverLimit(limit, have, len(wanted))
            if req.wait_id is not None:
                waits.take(c, req.wait_id, req.chat_id, req.start, req.source)
            out = []
            for gpu, uuid in req.gpus:
                row = c.execute(
                    claims.insert()
                    .values(
                        node=req.node,
                        gpu_index=gpu,
                        gpu_uuid=uuid,
                        user=req.user,
                        chat_id=req.chat_id,
                        started_at=at(req.start),
                        ends_at=at(req.end),
                        note=req.note,
                        state=ClaimState.ACTIVE.value,
                        holding=f"{req.node}:{gpu}",
                    )
                    .returning(claims.c.id)
                ).one()
                claim = self._get_in(c, int(row.id))
                out.append(claim)
                record(
                    c,
                    "claimed",
                    (req.chat_id, req.source),
                    req.node,
                    now=req.start,
                    **_payload(claim),
                )
            return Granted(tuple(out))

    def _extend(
        self,
        chat_id: str,
        scope: tuple[str | None, tuple[int, ...]],
        by_s: float,
        kw: dict[str, Any],
    ) -> list[tuple[Claim, bool]]:
        most: Callable[[str], float] = kw["most_s"]
        now, source = kw["now"], kw["source"]
        out = []
        with guard("cannot record the extension"), write_tx(self._engine) as c:
            for r in _scoped(c, chat_id, scope):
                old = _claim(r)
                end = min(old.end + by_s, old.start + most(old.node))
                c.execute(claims.update().where(claims.c.id == old.id).values(ends_at=at(end)))
                new = self._get_in(c, old.id)
                record(c, "extended", (chat_id, source), old.node, now=now, **_payload(new))
                out.append((new, end < old.end + by_s))
        return out

    def _release(
        self, chat_id: str | None, scope: tuple[str | None, tuple[int, ...]], kw: dict[str, Any]
    ) -> list[Claim]:
        now, source = kw["now"], kw["source"]
        why, ids, asked = kw.get("why", "released"), kw.get("ids"), kw.get("asked_before")
        out = []
        with guard("cannot record the release"), write_tx(self._engine) as c:
            for r in _scoped(c, chat_id, scope):
                if ids is not None and r.id not in ids:
                    continue
                if asked is not None and (unix(r.idle_dm_at) or float("inf")) > asked:
                    continue  # kept (or asked anew) since the duty read it: it stands
                out.append(
                    self._end(c, r.id, ClaimState.RELEASED, now, (chat_id or "gpubot", source), why)
                )
        return out

    def _expire(self, now: float, source: str) -> list[Claim]:
        with guard("cannot expire claims"), write_tx(self._engine) as c:
            due = c.execute(
                select(claims.c.id).where(
                    claims.c.state == ClaimState.ACTIVE.value, claims.c.ends_at <= at(now)
                )
            ).all()
            return [
                self._end(c, r.id, ClaimState.EXPIRED, now, ("gpubot", source), "expired")
                for r in due
            ]

    def _end(
        self,
        c: Connection,
        claim_id: int,
        state: ClaimState,
        now: float,
        who: tuple[str, str],
        why: str,
    ) -> Claim:
        c.execute(
            claims.update()
            .where(claims.c.id == claim_id, claims.c.state == ClaimState.ACTIVE.value)
            .values(state=state.value, ended_at=at(now), holding=None)
        )
        ended = self._get_in(c, claim_id)
        record(c, why, who, ended.node, now=now, **_payload(ended))
        return ended

    def _active(self, node: str | None) -> list[Claim]:
        with guard("cannot read claims"), read_tx(self._engine) as c:
            return [_claim(r) for r in _active_rows(c, node)]

    def _get(self, claim_id: int) -> Claim | None:
        with guard("cannot read claims"), read_tx(self._engine) as c:
            row = c.execute(select(claims).where(claims.c.id == claim_id)).one_or_none()
            return None if row is None else _claim(row)

    def _get_in(self, c: Connection, claim_id: int) -> Claim:
        return _claim(c.execute(select(claims).where(claims.c.id == claim_id)).one())

    def _used_last(self, chat_id: str, node: str) -> dict[int, float]:
        with guard("cannot read claims"), read_tx(self._engine) as c:
            rows = c.execute(
                select(claims.c.gpu_index, claims.c.started_at).where(
                    claims.c.chat_id == chat_id, claims.c.node == node
                )
            ).all()
        out: dict[int, float] = {}
        for r in rows:
            out[r.gpu_index] = max(out.get(r.gpu_index, 0.0), unix(r.started_at) or 0.0)
        return out


def _active_rows(c: Connection, node: str | None) -> list[Row[Any]]:
    q = select(claims).where(claims.c.state == ClaimState.ACTIVE.value)
    if node is not None:
        q = q.where(claims.c.node == node)
    return list(c.execute(q.order_by(claims.c.node, claims.c.gpu_index)).all())


def _scoped(
    c: Connection, chat_id: str | None, scope: tuple[str | None, tuple[int, ...]]
) -> list[Row[Any]]:
    node, gpus = scope
    rows = _active_rows(c, node)
    return [
        r
        for r in rows
        if (chat_id is None or r.chat_id == chat_id) and (not gpus or r.gpu_index in gpus)
    ]


def _claim(r: Row[Any]) -> Claim:
    return Claim(
        id=int(r.id),
        node=r.node,
        gpu=int(r.gpu_index),
        gpu_uuid=r.gpu_uuid,
        user=r.user,
        chat_id=r.chat_id,
        start=unix(r.started_at) or 0.0,
        end=unix(r.ends_at) or 0.0,
        note=r.note,
        state=ClaimState(r.state),
        ended_at=unix(r.ended_at),
        idle_since=unix(r.idle_since),
        idle_last_at=unix(r.idle_last_at),
        idle_dm_at=unix(r.idle_dm_at),
    )


def _payload(c: Claim) -> dict[str, Any]:
    return {
        "claim": c.id,
        "gpu": c.gpu,
        "gpu_uuid": c.gpu_uuid,
        "user": c.user,
        "start": at(c.start),
        "end": at(c.end),
        "note": c.note,
        "state": c.state.value,
    }
