"""The queue for GPUs: places in line, first come first served by id.

A free GPU is offered to the first in line with a conditional update (``waiting`` → ``offered``
only if still waiting and no other hold covers those GPUs), so two bot replicas that both see
it free send one DM. The hold lapses after ``hold_minutes``; the next in line is offered then.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from gpubot.core.claims.rules import Wait, WaitState
from gpubot.errors import UsageError
from gpubot.store import claim_rows as claim_store
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.tables import claim_waits
from gpubot.store.waits import in_thread

LIVE = (WaitState.WAITING.value, WaitState.OFFERED.value)


class WaitsMixin:
    """The queue's methods of ``DbClaims``."""

    _engine: Engine

    async def add_wait(self, wait: Wait, source: str) -> Wait:
        """Put ``wait`` (its id ignored) at the end of the line; return it with its id."""
        return await in_thread(self._add_wait, wait, source)

    async def waits(self, node: str | None = None) -> list[Wait]:
        """Return the live places (waiting or offered), first in line first."""
        return await in_thread(self._waits, node)

    async def get_wait(self, wait_id: int) -> Wait | None:
        """Return one place in the queue."""
        return await in_thread(self._get_wait, wait_id)

    async def leave(self, chat_id: str, wait_id: int | None, now: float, source: str) -> list[Wait]:
        """Leave the queue: one place of ``chat_id``'s, or all of them; return those left."""
        return await in_thread(self._leave, chat_id, wait_id, now, source)

    async def offer(
        self, wait_id: int, gpus: tuple[int, ...], hold_until: float, now: float
    ) -> Wait | None:
        """Hold ``gpus`` for a place still waiting; None when another replica got there first."""
        return await in_thread(self._offer, wait_id, gpus, hold_until, now)

    async def lapse(self, now: float) -> list[Wait]:
        """End the holds that ran out; return them (their GPUs go to the next in line)."""
        return await in_thread(self._lapse, now)

    async def told(self, wait_id: int, now: float) -> Wait | None:
        """Close a place whose person was told (``wait`` without claims): ``taken``."""
        return await in_thread(self._told, wait_id, now)

    # -- synchronous parts ------------------------------------------------------------------

    def _add_wait(self, w: Wait, source: str) -> Wait:
        with guard("cannot record the place in the queue"), write_tx(self._engine) as c:
            row = c.execute(
                claim_waits.insert()
                .values(
                    node=w.node,
                    gpus=_text(w.gpus),
                    count=w.count,
                    duration_s=None if w.duration_s is None else int(w.duration_s),
                    user=w.user,
                    chat_id=w.chat_id,
                    created_at=claim_store.at(w.created),
                    state=WaitState.WAITING.value,
                    offered="",
                )
                .returning(claim_waits.c.id)
            ).one()
            new = _get(c, int(row.id))
            _record(c, "queued", (w.chat_id, source), new, w.created)
            return new

    def _waits(self, node: str | None) -> list[Wait]:
        with guard("cannot read the queue"), read_tx(self._engine) as c:
            return live(c, node)

    def _get_wait(self, wait_id: int) -> Wait | None:
        with guard("cannot read the queue"), read_tx(self._engine) as c:
            row = c.execute(select(claim_waits).where(claim_waits.c.id == wait_id)).one_or_none()
            return None if row is None else _wait(row)

    def _leave(self, chat_id: str, wait_id: int | None, now: float, source: str) -> list[Wait]:
        with guard("cannot record leaving the queue"), write_tx(self._engine) as c:
            mine = [w for w in live(c, None) if w.chat_id == chat_id]
            if wait_id is not None:
                mine = [w for w in mine if w.id == wait_id]
            out = []
            for w in mine:
                _set(c, w.id, WaitState.LEFT)
                out.append(_get(c, w.id))
                _record(c, "left", (chat_id, source), out[-1], now)
            return out

    def _offer(
        self, wait_id: int, gpus: tuple[int, ...], hold_until: float, now: float
    ) -> Wait | None:
        with guard("cannot record the hold"), write_tx(self._engine) as c:
            w = _get(c, wait_id)
            if w.state is not WaitState.WAITING or holding(c, w.node, list(gpus), now):
                return None
            c.execute(
                claim_waits.update()
                .where(claim_waits.c.id == wait_id, claim_waits.c.state == WaitState.WAITING.value)
                .values(
                    state=WaitState.OFFERED.value,
                    offered=_text(gpus),
                    hold_until=claim_store.at(hold_until),
                )
            )
            held = _get(c, wait_id)
            _record(c, "offered", ("gpubot", "gpubot"), held, now)
            return held

    def _lapse(self, now: float) -> list[Wait]:
        with guard("cannot end holds"), write_tx(self._engine) as c:
            due = c.execute(
                select(claim_waits).where(
                    claim_waits.c.state == WaitState.OFFERED.value,
                    claim_waits.c.hold_until <= claim_store.at(now),
                )
            ).all()
            out = []
            for r in due:
                _set(c, int(r.id), WaitState.LAPSED)
                out.append(_get(c, int(r.id)))
                _record(c, "lapsed", ("gpubot", "gpubot"), out[-1], now)
            return out

    def _told(self, wait_id: int, now: float) -> Wait | None:
        with guard("cannot record the queue"), write_tx(self._engine) as c:
            w = _get(c, wait_id)
            if w.state is not WaitState.OFFERED:
                return None
            _set(c, wait_id, WaitState.TAKEN)
            done = _get(c, wait_id)
            _record(c, "told", ("gpubot", "gpubot"), done, now)
            return done


def live(c: Connection, node: str | None) -> list[Wait]:
    """Return the live places (of ``node``), first in line first."""
    q = select(claim_waits).where(claim_waits.c.state.in_(LIVE))
    if node is not None:
        q = q.where(claim_waits.c.node == node)
    return [_wait(r) for r in c.execute(q.order_by(claim_waits.c.id)).all()]


def holding(
    c: Connection, node: str, gpus: list[int], now: float, *, but: int | None = None
) -> list[Wait]:
    """Return the live holds on ``node`` that keep any of ``gpus`` (except the place ``but``)."""
    return [
        w
        for w in live(c, node)
        if w.state is WaitState.OFFERED
        and w.id != but
        and (w.hold_until or 0.0) > now
        and set(w.offered) & set(gpus)
    ]


def take(c: Connection, wait_id: int, chat_id: str, now: float, source: str) -> Wait:
    """Mark the hold ``wait_id`` taken by its person (inside their claim's transaction)."""
    w = _get(c, wait_id)
    if w.chat_id != chat_id:
        raise UsageError(f"place {wait_id} in the queue is someone else's")
    if w.state is not WaitState.OFFERED or (w.hold_until or 0.0) <= now:
        raise UsageError(f"the hold of place {wait_id} has ended ({w.state.value})")
    _set(c, wait_id, WaitState.TAKEN)
    taken = _get(c, wait_id)
    _record(c, "taken", (chat_id, source), taken, now)
    return taken


def _set(c: Connection, wait_id: int, state: WaitState) -> None:
    c.execute(claim_waits.update().where(claim_waits.c.id == wait_id).values(state=state.value))


def _get(c: Connection, wait_id: int) -> Wait:
    row = c.execute(select(claim_waits).where(claim_waits.c.id == wait_id)).one_or_none()
    if row is None:
        raise UsageError(f"no place {wait_id} in the queue")
    return _wait(row)


def _record(c: Connection, change: str, who: tuple[str, str], w: Wait, now: float) -> None:
    claim_store.record(
        c,
        change,
        who,
        w.node,
        now=now,
        wait=w.id,
        gpus=list(w.gpus),
        count=w.count,
        user=w.user,
        state=w.state.value,
        offered=list(w.offered),
        hold_until=None if w.hold_until is None else claim_store.at(w.hold_until),
    )


def _text(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus)


def _gpus(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _wait(r: Row[Any]) -> Wait:
    return Wait(
        id=int(r.id),
        node=r.node,
        gpus=_gpus(r.gpus),
        count=int(r._mapping["count"]),
        duration_s=None if r.duration_s is None else float(r.duration_s),
        user=r.user,
        chat_id=r.chat_id,
        created=claim_store.unix(r.created_at) or 0.0,
        state=WaitState(r.state),
        offered=_gpus(r.offered),
        hold_until=claim_store.unix(r.hold_until),
    )
