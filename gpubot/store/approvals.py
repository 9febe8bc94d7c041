"""Approval records for forced actions: pending → approved | denied | expired | cancelled,
then approved → executed | failed | incomplete (the bot stopped before recording the end) |
waiting (it could not run yet: the node busy, the lease lost, the database down); waiting →
approved (a retry takes it, once, at ``taken_at``) | failed (its time to run ran out).

Each transition is one conditional UPDATE (``WHERE state = <from> ...``) inside the write lock,
appended to the audit chain in the same transaction: two approvers clicking at once, or one
clicking twice, change the state exactly once. Who may approve is the approvals service's
business; the store enforces the transitions, the expiry and that nobody decides their own.

The request (``ApprovalRequest``) is typed everywhere else; ``marshal``/``unmarshal`` here are
the only code that knows its JSON: the plan's fields at the top level, beside ``command``,
``grace_s`` and ``requester_user`` (the shape every stored row has had).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, func, select

from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import ApprovalRequest
from gpubot.core.models import ApprovalState
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import (
    AlreadyDecided,
    ApprovalError,
    ApprovalExpired,
    GpubotError,
    SelfApproval,
    StoreError,
)
from gpubot.store.audit import append
from gpubot.store.chain import canonical_json
from gpubot.store.engine import Part, guard, reads, run_tx, write_tx, writes
from gpubot.store.records import Approval, iso, parse_iso, parse_opt
from gpubot.store.tables import approvals
from gpubot.store.waits import in_thread

DEFAULT_EXPIRY_S = 900.0
S = ApprovalState


class DbApprovals(Part):
    """The ``ApprovalStore`` (``core.approval.ports``) on one engine."""

    @writes("cannot record the approval request")
    def create(
        self,
        conn: Connection,
        requester: str,
        requester_name: str,
        node: str,
        request: ApprovalRequest,
        expires_in_s: float = DEFAULT_EXPIRY_S,
        *,
        source: str = "chat",
        now: datetime | None = None,
    ) -> Approval:
        if expires_in_s <= 0:
            raise ApprovalError(f"an approval must expire in the future, not {expires_in_s}s")
        at = now or datetime.now(UTC)
        expires = iso(at + timedelta(seconds=expires_in_s))
        plan = marshal(request)
        key = conn.execute(
            approvals.insert().values(
                requester=requester,
                requester_name=requester_name,
                source=source,
                node=node,
                plan=canonical_json(plan),
                state=S.PENDING.value,
                created_at=iso(at),
                expires_at=expires,
            )
        ).inserted_primary_key
        if key is None:
            raise ApprovalError("the database gave the new approval no id")
        aid = int(key[0])
        detail = {"plan": plan, "expires_at": expires, "requester_name": requester_name}
        _audit(conn, aid, node, (None, S.PENDING), (requester, source), at, detail)
        return _load(conn, aid)

    async def decide(
        self,
        approval_id: int,
        approver: str,
        approve: bool,
        now: datetime,
        *,
        approver_name: str = "",
        source: str = "chat",
    ) -> Approval:
        """Approve or deny a pending request exactly once; raise SelfApproval, ApprovalExpired,
        AlreadyDecided (or ApprovalError for an unknown id)."""
        return await in_thread(
            self._decide, approval_id, approver, approve, now, approver_name, source
        )

    async def cancel(
        self, approval_id: int, by: str, now: datetime, *, source: str = "chat"
    ) -> Approval:
        """Cancel a pending request (the service checks that ``by`` may)."""
        return await self._move(approval_id, (S.PENDING,), S.CANCELLED, now, None, by, source)

    async def mark_executed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """AlreadyDecided if it is not (or no longer) approved."""
        return await self._move(approval_id, (S.APPROVED,), S.EXECUTED, now, result)

    async def mark_failed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """AlreadyDecided if it is neither approved nor waiting."""
        return await self._move(approval_id, (S.APPROVED, S.WAITING), S.FAILED, now, result)

    async def mark_waiting(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        return await self._move(approval_id, (S.APPROVED,), S.WAITING, now, result)

    async def resume(self, approval_id: int, *, now: datetime | None = None) -> Approval:
        """AlreadyDecided if another try took it first."""
        return await self._move(approval_id, (S.WAITING,), S.APPROVED, now, None)

    async def mark_incomplete(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        return await self._move(approval_id, (S.APPROVED,), S.INCOMPLETE, now, result)

    @reads("cannot read approvals")
    def waiting(self, conn: Connection, source: str | None = None) -> list[Approval]:
        return _in_state(conn, S.WAITING, source)

    @reads("cannot read approvals")
    def pending(self, conn: Connection, source: str | None = None) -> list[Approval]:
        """Every pending approval (of ``source``), oldest first (they survive restarts)."""
        return _in_state(conn, S.PENDING, source)

    @reads("cannot read approvals")
    def approved(
        self, conn: Connection, decided_before: datetime, source: str | None = None
    ) -> list[Approval]:
        settled = func.coalesce(approvals.c.taken_at, approvals.c.decided_at)  # the later
        where = and_(approvals.c.state == S.APPROVED.value, settled < iso(decided_before))
        rows = conn.execute(
            select(approvals).where(_of(where, source)).order_by(approvals.c.id)
        ).all()
        return [_approval(r) for r in rows]

    @writes("cannot expire approvals")
    def expire_due(
        self, conn: Connection, now: datetime, source: str | None = None
    ) -> list[Approval]:
        due_now = and_(approvals.c.state == S.PENDING.value, approvals.c.expires_at <= iso(now))
        due_now = _of(due_now, source)
        due = conn.execute(select(approvals.c.id).where(due_now).order_by(approvals.c.id)).all()
        return [_move_in(conn, r.id, (S.PENDING,), S.EXPIRED, now, None) for r in due]

    @writes("cannot record the approval message")
    def set_message(self, conn: Connection, approval_id: int, ref: MessageRef) -> None:
        changed = conn.execute(
            approvals.update().where(approvals.c.id == approval_id).values(ref=ref)
        )
        if changed.rowcount != 1:
            raise ApprovalError(f"there is no approval {approval_id}")

    @reads("cannot read approvals")
    def get(self, conn: Connection, approval_id: int) -> Approval | None:
        row = _row(conn, approval_id)
        return None if row is None else _approval(row)

    def _decide(
        self, aid: int, approver: str, approve: bool, now: datetime, approver_name: str, source: str
    ) -> Approval:
        new = S.APPROVED if approve else S.DENIED
        error: GpubotError
        with guard("cannot record the decision"), write_tx(self._engine) as conn:
            changed = conn.execute(
                approvals.update()
                .where(
                    approvals.c.id == aid,
                    approvals.c.state == S.PENDING.value,
                    approvals.c.expires_at > iso(now),
                    approvals.c.requester != approver,
                )
                .values(
                    state=new.value,
                    decided_by=approver,
                    decided_by_name=approver_name,
                    decided_at=iso(now),
                )
            )
            if changed.rowcount == 1:
                a = _load(conn, aid)
                moved = (S.PENDING, new)
                _audit(
                    conn, aid, a.node, moved, (approver, source), now, {"by_name": approver_name}
                )
                return a
            row = _row(conn, aid)
            if row is None:
                error = ApprovalError(f"there is no approval {aid}")
            elif row.requester == approver:
                what = "request" if _is_change(row.plan) else "forced kill"
                error = SelfApproval(
                    f"you cannot approve your own {what}: ask another approver"
                    if approve
                    else "you cannot decide your own request: cancel it instead"
                )
            elif row.state != S.PENDING.value:
                error = _already(aid, row)
            else:  # pending, but its time is up: expire it now (committed), then refuse
                _move_in(conn, aid, (S.PENDING,), S.EXPIRED, now, None)
                error = ApprovalExpired(
                    f"approval {aid} expired at {row.expires_at[11:19]} UTC: request it again"
                )
        raise error

    async def _move(
        self,
        aid: int,
        from_: tuple[S, ...],
        to: S,
        now: datetime | None,
        result: Mapping[str, Any] | None,
        by: str = "gpubot",
        source: str = "gpubot",
    ) -> Approval:
        def move(conn: Connection) -> Approval:
            return _move_in(conn, aid, from_, to, now, result, by, source)

        what = f"cannot record approval {aid} as {to.value}"
        return await in_thread(run_tx, self._engine, what, move, True)


def _move_in(
    conn: Connection,
    aid: int,
    from_: tuple[S, ...],
    to: S,
    now: datetime | None,
    result: Mapping[str, Any] | None,
    by: str = "gpubot",
    source: str = "gpubot",
) -> Approval:
    at = now or datetime.now(UTC)
    values: dict[str, Any] = {"state": to.value}
    if to in (S.EXECUTED, S.FAILED, S.INCOMPLETE):
        values |= {"finished_at": iso(at), "result": canonical_json(result or {})}
    elif to is S.WAITING:  # who approved it, and when, stay as they are
        values |= {"result": canonical_json(result or {})}
    elif S.WAITING in from_:  # a retry takes it: still the approver's decision, taken now
        values |= {"taken_at": iso(at)}
    else:
        values |= {"decided_by": by, "decided_at": iso(at)}
    row = _row(conn, aid)
    if row is None:
        raise ApprovalError(f"there is no approval {aid}")
    changed = conn.execute(
        approvals.update()
        .where(approvals.c.id == aid, approvals.c.state.in_([s.value for s in from_]))
        .values(**values)
    )
    if changed.rowcount != 1:
        raise _already(aid, row)
    extra = {} if result is None else {"result": result}
    _audit(conn, aid, row.node, (S(row.state), to), (by, source), at, extra)
    return _load(conn, aid)


def _of(where: ColumnElement[bool], source: str | None) -> ColumnElement[bool]:
    """``where``, of the approvals that came from ``source`` only (None: from any)."""
    return where if source is None else and_(where, approvals.c.source == source)


def _in_state(conn: Connection, state: S, source: str | None = None) -> list[Approval]:
    where = _of(approvals.c.state == state.value, source)
    q = select(approvals).where(where).order_by(approvals.c.id)
    return [_approval(r) for r in conn.execute(q).all()]


def _row(conn: Connection, aid: int) -> Row[Any] | None:
    return conn.execute(select(approvals).where(approvals.c.id == aid)).one_or_none()


def _load(conn: Connection, aid: int) -> Approval:
    row = _row(conn, aid)
    if row is None:
        raise ApprovalError(f"there is no approval {aid}")
    return _approval(row)


def _audit(
    conn: Connection,
    aid: int,
    node: str,
    move: tuple[S | None, S],
    who: tuple[str, str],
    at: datetime,
    extra: Mapping[str, Any],
) -> None:
    """Record approval ``aid``'s ``move`` (from, to) by ``who`` (actor, source), in the
    transaction of the move."""
    was, to = move
    payload = {"approval": aid, "from": None if was is None else was.value, "to": to.value}
    actor, source = who
    append(
        conn,
        kind="approval",
        actor=actor,
        source=source,
        node=node,
        payload={**payload, **extra},
        now=at,
    )


def _already(aid: int, row: Row[Any]) -> ApprovalError:
    if row.state == S.PENDING.value:
        return ApprovalError(f"approval {aid} is still pending")
    who = row.decided_by_name or row.decided_by
    by = f" by {who}" if who and row.state != S.EXPIRED.value else ""
    return AlreadyDecided(f"approval {aid} is already {row.state}{by}")


# The key of a node change's stored form; a row without it (every row from before drains were
# approved) is a reset plan, read as it always was.
CHANGE = "node_change"


def marshal(request: ApprovalRequest) -> dict[str, Any]:
    """Return the JSON form of a request, as stored (and as the audit chain records it): a reset
    plan's own fields, or a node change under ``CHANGE``."""
    plan = request.plan
    what = {CHANGE: plan.to_dict()} if isinstance(plan, NodeChange) else plan.to_dict()
    return {
        **what,
        "grace_s": request.grace_s,
        "command": request.command,
        "requester_user": request.requester_user,
    }


def _is_change(stored: str) -> bool:
    """Whether a stored request is a node change (the words of a refusal only)."""
    try:
        data = json.loads(stored)
    except ValueError:
        return False
    return isinstance(data, dict) and CHANGE in data


def unmarshal(data: Any, approval_id: int) -> ApprovalRequest:
    """Rebuild a request from its stored JSON; raise ``StoreError`` naming the approval if it
    cannot be read. Rows from before a field existed load with its default."""
    try:
        change = data.get(CHANGE)
        plan = ResetPlan.from_dict(data) if change is None else NodeChange.from_dict(change)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(
            f"approval {approval_id}: its stored plan cannot be read ({type(exc).__name__}: {exc})"
        ) from None
    grace = data.get("grace_s")
    user = data.get("requester_user")
    return ApprovalRequest(
        plan,
        command=str(data.get("command") or ""),
        grace_s=float(grace)
        if isinstance(grace, int | float) and not isinstance(grace, bool)
        else None,
        requester_user=user if isinstance(user, str) else None,
    )


def _approval(row: Row[Any]) -> Approval:
    return Approval(
        id=int(row.id),
        requester=row.requester,
        requester_name=row.requester_name,
        source=row.source,
        node=row.node,
        request=unmarshal(json.loads(row.plan), int(row.id)),
        state=S(row.state),
        created_at=parse_iso(row.created_at),
        expires_at=parse_iso(row.expires_at),
        decided_by=row.decided_by,
        decided_by_name=row.decided_by_name,
        decided_at=parse_opt(row.decided_at),
        finished_at=parse_opt(row.finished_at),
        result=None if row.result is None else json.loads(row.result),
        ref=None if row.ref is None else MessageRef(row.ref),
        taken_at=parse_opt(row.taken_at),
    )
