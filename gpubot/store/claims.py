"""GPU claims on the database: conditional writes, every change audited.

Writes hold the database-wide write lock, so the check for a conflicting claim and the insert
are one step across replicas and the CLI: two people who claim one GPU at once get one winner.
The unique ``holding`` column is the database's own backstop. Each change appends its audit
record in the same transaction. Each claim keeps its GPU's idle run, never a history; asking
Keep / Release once, and a Keep, are conditional writes too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Update, func, or_, select

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
from gpubot.store.claim_waits import BY_GPUBOT, record, unix
from gpubot.store.engine import guard, read_tx, reads, writes
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import claims

Interval = tuple[str, int, str, float, float]  # node, gpu, user, start, end
IdleUpdate = tuple[int, float | None, float, float | None]  # id, idle since, last look, read
Scope = tuple[str | None, tuple[int, ...]]  # a node (None: any) and its GPUs (none: all)


class DbClaims(waits.WaitsMixin):
    """Claims and the queue; every method is async and raises ``StoreError``."""

    @writes("cannot record the claim, so nothing was claimed")
    def claim(self, c: Connection, req: ClaimRequest) -> ClaimOutcome:
        """Write the claim if no one else claims or holds those GPUs and no limit is passed."""
        wanted = [g for g, _ in req.gpus]
        taken = [x for x in map(claim_of, _active_rows(c, req.node)) if x.gpu in wanted]
        held = [x for x in taken if x.chat_id != req.chat_id]
        mine_held = [x for x in taken if x.chat_id == req.chat_id]
        holds = waits.holding(c, req.node, wanted, req.start, but=req.wait_id)
        if held or holds or mine_held:
            return Conflict(tuple(held or mine_held), tuple(holds))
        mine = [claim_of(r) for r in _active_rows(c, None) if r.chat_id == req.chat_id]
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
                    started_at=text_of(req.start),
                    ends_at=text_of(req.end),
                    note=req.note,
                    state=ClaimState.ACTIVE.value,
                    holding=f"{req.node}:{gpu}",
                )
                .returning(claims.c.id)
            ).one()
            claim = get_claim(c, int(row.id))
            out.append(claim)
            who = (req.chat_id, req.source)
            record(c, "claimed", who, req.node, now=req.start, **_payload(claim))
        return Granted(tuple(out))

    @writes("cannot record the extension")
    def extend(
        self, c: Connection, /, chat_id: str, scope: Scope, by_s: float, **kw: Any
    ) -> list[tuple[Claim, bool]]:
        """Extend ``chat_id``'s active claims in ``scope``; each with whether a limit cut it."""
        most: Callable[[str], float] = kw["most_s"]
        now, source = kw["now"], kw["source"]
        out = []
        for r in _scoped(c, chat_id, scope):
            old = claim_of(r)
            end = min(old.end + by_s, old.start + most(old.node))
            c.execute(claims.update().where(claims.c.id == old.id).values(ends_at=text_of(end)))
            new = get_claim(c, old.id)
            record(c, "extended", (chat_id, source), old.node, now=now, **_payload(new))
            out.append((new, end < old.end + by_s))
        return out

    @writes("cannot record the release")
    def release(
        self, c: Connection, /, chat_id: str | None, scope: Scope, **kw: Any
    ) -> list[Claim]:
        """Release active claims in ``scope`` (``chat_id`` None: whoever's); ``asked_before``:
        only those asked Keep / Release by then and not kept, checked in the same transaction."""
        now, source = kw["now"], kw["source"]
        why, ids, asked = kw.get("why", "released"), kw.get("ids"), kw.get("asked_before")
        out = []
        for r in _scoped(c, chat_id, scope):
            if ids is not None and r.id not in ids:
                continue
            if asked is not None and (unix(r.idle_dm_at) or float("inf")) > asked:
                continue  # kept (or asked anew) since the duty read it: it stands
            who = (chat_id or "gpubot", source)
            out.append(_end(c, r.id, ClaimState.RELEASED, now, who, why))
        return out

    @writes("cannot expire claims")
    def expire(self, c: Connection, now: float, source: str = "gpubot") -> list[Claim]:
        """Expire the active claims whose time ran out; return those this call expired."""
        due = c.execute(
            select(claims.c.id).where(
                claims.c.state == ClaimState.ACTIVE.value, claims.c.ends_at <= text_of(now)
            )
        ).all()
        return [_end(c, r.id, ClaimState.EXPIRED, now, ("gpubot", source), "expired") for r in due]

    @reads("cannot read claims")
    def active(self, c: Connection, node: str | None = None) -> list[Claim]:
        return [claim_of(r) for r in _active_rows(c, node)]

    @reads("cannot read claims")
    def get(self, c: Connection, claim_id: int) -> Claim | None:
        row = c.execute(select(claims).where(claims.c.id == claim_id)).one_or_none()
        return None if row is None else claim_of(row)

    @reads("cannot read claims")
    def used_last(self, c: Connection, chat_id: str, node: str) -> dict[int, float]:
        """Return GPU → when ``chat_id``'s last claim of it on ``node`` began."""
        rows = c.execute(
            select(claims.c.gpu_index, claims.c.started_at).where(
                claims.c.chat_id == chat_id, claims.c.node == node
            )
        ).all()
        out: dict[int, float] = {}
        for r in rows:
            out[r.gpu_index] = max(out.get(r.gpu_index, 0.0), unix(r.started_at) or 0.0)
        return out

    async def advance_idle(self, updates: Sequence[IdleUpdate]) -> None:
        """Store each claim's idle run, only over the one it was folded from: a Keep in between
        started the run anew, and stands. A GPU no longer idle forgets the question asked."""
        if updates:
            await self._advance_idle(list(updates))

    @writes("cannot record the idle claim")
    def mark_idle_dm(self, c: Connection, claim_id: int, now: float) -> bool:
        """Record that the holder is asked Keep / Release; False when it was (one DM in all)."""
        unasked = (claims.c.idle_dm_at.is_(None),)
        asked = _change(c, claim_id, unasked, {"idle_dm_at": text_of(now)})
        if asked is not None:
            record(c, "idle-asked", BY_GPUBOT, asked.node, now=now, claim=claim_id)
        return asked is not None

    @writes("cannot record the intruder")
    def tell_intruder(self, c: Connection, claim_id: int, key: str, now: float) -> bool:
        """Record that the holder is told of intruder ``key``; False when they were already."""
        # Every intruder told of, one a line ("\nk1\nk2\n"): not only the last one, or two
        # intruders seen by alternating replicas would be told again and again.
        untold = or_(
            claims.c.intruder_told.is_(None),
            ~claims.c.intruder_told.contains(f"\n{key}\n", autoescape=True),
        )
        told = func.coalesce(claims.c.intruder_told, "\n") + f"{key}\n"
        found = _change(c, claim_id, (untold,), {"intruder_told": told})
        if found is not None:
            record(c, "intruder", BY_GPUBOT, found.node, now=now, claim=claim_id, key=key)
        return found is not None

    @writes("cannot record the keep")
    def keep(
        self, c: Connection, claim_id: int, chat_id: str, now: float, source: str
    ) -> Claim | None:
        """Keep an idle claim (its holder only): its idle run starts anew."""
        row = c.execute(select(claims.c.chat_id).where(claims.c.id == claim_id)).one_or_none()
        if row is None or row.chat_id != chat_id:
            return None
        anew = {"idle_since": None, "idle_last_at": None, "idle_dm_at": None}
        kept = _change(c, claim_id, (), anew)
        if kept is not None:
            record(c, "kept", (chat_id, source), kept.node, now=now, claim=claim_id)
        return kept

    @writes("cannot record idle claims")
    def _advance_idle(self, c: Connection, updates: list[IdleUpdate]) -> None:
        for claim_id, since, last, read in updates:
            now_last = c.execute(
                select(claims.c.idle_last_at).where(claims.c.id == claim_id)
            ).scalar()
            if unix(now_last) != read:  # kept (or looked at elsewhere) since it was read
                continue
            values: dict[str, str | None] = {
                "idle_since": None if since is None else text_of(since),
                "idle_last_at": text_of(last),
            }
            if since is None:
                values["idle_dm_at"] = None
            c.execute(_active(claim_id).values(**values))

    def intervals(self, since: float, until: float) -> Iterable[Interval]:
        """Return (node, gpu, user, start, end) of every claim overlapping [since, until), cut
        to it (synchronous: call it in a worker thread)."""
        with guard("cannot read claims"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(claims).where(claims.c.started_at < text_of(until)).order_by(claims.c.id)
            ).all()
        out: list[Interval] = []
        for r in rows:
            c = claim_of(r)
            end = min(c.end, c.ended_at if c.ended_at is not None else c.end)
            if end > since and c.start < until:
                out.append((c.node, c.gpu, c.user, max(c.start, since), min(end, until)))
        return out


def _end(
    c: Connection, claim_id: int, state: ClaimState, now: float, who: tuple[str, str], why: str
) -> Claim:
    c.execute(_active(claim_id).values(state=state.value, ended_at=text_of(now), holding=None))
    ended = get_claim(c, claim_id)
    record(c, why, who, ended.node, now=now, **_payload(ended))
    return ended


def _active_rows(c: Connection, node: str | None) -> list[Row[Any]]:
    q = select(claims).where(claims.c.state == ClaimState.ACTIVE.value)
    if node is not None:
        q = q.where(claims.c.node == node)
    return list(c.execute(q.order_by(claims.c.node, claims.c.gpu_index)).all())


def _scoped(c: Connection, chat_id: str | None, scope: Scope) -> list[Row[Any]]:
    node, gpus = scope
    rows = _active_rows(c, node)
    return [
        r
        for r in rows
        if (chat_id is None or r.chat_id == chat_id) and (not gpus or r.gpu_index in gpus)
    ]


def _payload(c: Claim) -> dict[str, Any]:
    return {
        "claim": c.id,
        "gpu": c.gpu,
        "gpu_uuid": c.gpu_uuid,
        "user": c.user,
        "start": text_of(c.start),
        "end": text_of(c.end),
        "note": c.note,
        "state": c.state.value,
    }


def get_claim(c: Connection, claim_id: int) -> Claim:
    return claim_of(c.execute(select(claims).where(claims.c.id == claim_id)).one())


def claim_of(r: Row[Any]) -> Claim:
    return Claim(
        id=int(r.id),
        node=r.node,
        gpu=int(r.gpu_index),
        gpu_uuid=r.gpu_uuid,
        user=r.user,
        chat_id=r.chat_id,
        start=unix_of(r.started_at),
        end=unix_of(r.ends_at),
        note=r.note,
        state=ClaimState(r.state),
        ended_at=unix(r.ended_at),
        idle_since=unix(r.idle_since),
        idle_last_at=unix(r.idle_last_at),
        idle_dm_at=unix(r.idle_dm_at),
    )


def _active(claim_id: int) -> Update:
    return claims.update().where(claims.c.id == claim_id, claims.c.state == ClaimState.ACTIVE.value)


def _change(
    c: Connection, claim_id: int, where: tuple[ColumnElement[bool], ...], values: dict[str, Any]
) -> Claim | None:
    """Set ``values`` on an active claim where ``where`` holds; return it (None: unchanged)."""
    done = c.execute(_active(claim_id).where(*where).values(**values))
    return get_claim(c, claim_id) if done.rowcount == 1 else None
