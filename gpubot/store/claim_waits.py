"""The queue for GPUs: places in line, first come first served by id; and the audit records and
times that claims share with it.

A free GPU is offered to the first in line with a conditional update (``waiting`` → ``offered``
only if still waiting and no other hold covers those GPUs), so two bot replicas that both see
it free send one DM. The hold lapses after ``hold_minutes``; the next in line is offered then.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, select

from gpubot.core.claims.rules import Wait, WaitState
from gpubot.errors import UsageError
from gpubot.store.audit import append
from gpubot.store.engine import Part, reads, writes
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import claim_waits

KIND = "claim"  # the audit records' kind, of claims and of the queue
BY_GPUBOT = ("gpubot", "gpubot")  # the actor and source of gpubot's own changes


def unix(text: str | None) -> float | None:
    return None if text is None else unix_of(text)


def record(conn: Connection, change: str, who: tuple[str, str], node: str, **payload: Any) -> None:
    """Append the audit record of one change (``who``: actor, source)."""
    now = payload.pop("now")
    append(
        conn,
        kind=KIND,
        actor=who[0],
        source=who[1],
        node=node,
        payload={"change": change, **payload},
        now=datetime.fromtimestamp(now, UTC),
    )


class WaitsMixin(Part):
    """The queue's methods of ``DbClaims``."""

    @writes("cannot record the place in the queue")
    def add_wait(self, c: Connection, wait: Wait, source: str) -> Wait:
        """Put ``wait`` (its id ignored) at the end of the line; return it with its id."""
        row = c.execute(
            claim_waits.insert()
            .values(
                node=wait.node,
                gpus=_text(wait.gpus),
                count=wait.count,
                duration_s=None if wait.duration_s is None else int(wait.duration_s),
                user=wait.user,
                chat_id=wait.chat_id,
                created_at=text_of(wait.created),
                state=WaitState.WAITING.value,
                offered="",
            )
            .returning(claim_waits.c.id)
        ).one()
        new = _get(c, int(row.id))
        _record(c, "queued", (wait.chat_id, source), new, wait.created)
        return new

    @reads("cannot read the queue")
    def waits(self, c: Connection, node: str | None = None) -> list[Wait]:
        return live(c, node)

    @reads("cannot read the queue")
    def get_wait(self, c: Connection, wait_id: int) -> Wait | None:
        return _find(c, wait_id)

    @writes("cannot record leaving the queue")
    def leave(
        self, c: Connection, chat_id: str, wait_id: int | None, now: float, source: str
    ) -> list[Wait]:
        """Leave the queue: one place of ``chat_id``'s, or all of them; return those left."""
        mine = [w for w in live(c, None) if w.chat_id == chat_id]
        if wait_id is not None:
            mine = [w for w in mine if w.id == wait_id]
        return [_move(c, w.id, WaitState.LEFT, "left", (chat_id, source), now) for w in mine]

    @writes("cannot record the hold")
    def offer(
        self, c: Connection, wait_id: int, gpus: tuple[int, ...], hold_until: float, now: float
    ) -> Wait | None:
        """Hold ``gpus`` for a place still waiting; None when another replica got there first."""
        w = _get(c, wait_id)
        if w.state is not WaitState.WAITING or holding(c, w.node, list(gpus), now):
            return None
        c.execute(
            claim_waits.update()
            .where(claim_waits.c.id == wait_id, claim_waits.c.state == WaitState.WAITING.value)
            .values(
                state=WaitState.OFFERED.value, offered=_text(gpus), hold_until=text_of(hold_until)
            )
        )
        held = _get(c, wait_id)
        _record(c, "offered", BY_GPUBOT, held, now)
        return held

    @writes("cannot end holds")
    def lapse(self, c: Connection, now: float) -> list[Wait]:
        """End the holds that ran out; return them (their GPUs go to the next in line)."""
        due = c.execute(
            select(claim_waits.c.id).where(
                claim_waits.c.state == WaitState.OFFERED.value,
                claim_waits.c.hold_until <= text_of(now),
            )
        ).all()
        return [_move(c, int(r.id), WaitState.LAPSED, "lapsed", BY_GPUBOT, now) for r in due]

    @writes("cannot record the queue")
    def told(self, c: Connection, wait_id: int, now: float) -> Wait | None:
        """Close a place whose person was told (``wait`` without claims): ``taken``."""
        if _get(c, wait_id).state is not WaitState.OFFERED:
            return None
        return _move(c, wait_id, WaitState.TAKEN, "told", BY_GPUBOT, now)


def live(c: Connection, node: str | None) -> list[Wait]:
    """Return the live places (of ``node``), first in line first."""
    live = (WaitState.WAITING.value, WaitState.OFFERED.value)
    q = select(claim_waits).where(claim_waits.c.state.in_(live))
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
    return _move(c, wait_id, WaitState.TAKEN, "taken", (chat_id, source), now)


def _move(
    c: Connection, wait_id: int, state: WaitState, change: str, who: tuple[str, str], now: float
) -> Wait:
    """Set a place's state and audit the change; return the place as it is now."""
    c.execute(claim_waits.update().where(claim_waits.c.id == wait_id).values(state=state.value))
    moved = _get(c, wait_id)
    _record(c, change, who, moved, now)
    return moved


def _find(c: Connection, wait_id: int) -> Wait | None:
    row = c.execute(select(claim_waits).where(claim_waits.c.id == wait_id)).one_or_none()
    return None if row is None else _wait(row)


def _get(c: Connection, wait_id: int) -> Wait:
    found = _find(c, wait_id)
    if found is None:
        raise UsageError(f"no place {wait_id} in the queue")
    return found


def _record(c: Connection, change: str, who: tuple[str, str], w: Wait, now: float) -> None:
    record(
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
        hold_until=None if w.hold_until is None else text_of(w.hold_until),
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
        created=unix_of(r.created_at),
        state=WaitState(r.state),
        offered=_gpus(r.offered),
        hold_until=unix(r.hold_until),
    )
