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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, func, select

from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import ApprovalRequest
from gpubot.core.models import ApprovalState
from gpubot.core.reset.plan import ResetPlan
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
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.records import Approval, iso, parse_iso
from gpubot.store.tables import approvals
from gpubot.store.waits import in_thread

DEFAULT_EXPIRY_S = 900.0
S = ApprovalState
TO_RUN = (S.APPROVED, S.WAITING)  # approved, and not run to an end yet


class DbApprovals:
    """The ``ApprovalStore`` on one engine; every method is async and raises ``StoreError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def create(
        self,
        requester: str,
        requester_name: str,
        node: str,
        request: ApprovalRequest,
        expires_in_s: float = DEFAULT_EXPIRY_S,
        *,
        source: str = "chat",
        now: datetime | None = None,
    ) -> Approval:
        """Record a pending request that expires ``expires_in_s`` seconds from ``now``."""
        return await in_thread(
            self._create, requester, requester_name, node, request, expires_in_s, source, now
        )

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
        return await in_thread(
            self._move, approval_id, (S.PENDING,), S.CANCELLED, by, source, now, None
        )

    async def mark_executed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that the approved action ran; AlreadyDecided if it is not (or no longer)
        approved."""
        return await in_thread(
            self._move, approval_id, (S.APPROVED,), S.EXECUTED, "gpubot", "gpubot", now, result
        )

    async def mark_failed(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that the approved (or waiting) action failed; AlreadyDecided if it is
        neither."""
        return await in_thread(
            self._move, approval_id, TO_RUN, S.FAILED, "gpubot", "gpubot", now, result
        )

    async def mark_waiting(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that an approved action could not run yet (``result`` says why)."""
        return await in_thread(
            self._move, approval_id, (S.APPROVED,), S.WAITING, "gpubot", "gpubot", now, result
        )

    async def resume(self, approval_id: int, *, now: datetime | None = None) -> Approval:
        """Take a waiting approval back to approved to run it; AlreadyDecided if another try
        took it first."""
        return await in_thread(
            self._move, approval_id, (S.WAITING,), S.APPROVED, "gpubot", "gpubot", now, None
        )

    async def waiting(self) -> list[Approval]:
        """Return the approvals waiting to be retried, oldest first."""
        return await in_thread(self._in_state, S.WAITING)

    async def mark_incomplete(
        self, approval_id: int, result: Mapping[str, Any], *, now: datetime | None = None
    ) -> Approval:
        """Record that an approved action never recorded its end (the bot stopped mid-run)."""
        return await in_thread(
            self._move, approval_id, (S.APPROVED,), S.INCOMPLETE, "gpubot", "gpubot", now, result
        )

    async def approved(self, decided_before: datetime) -> list[Approval]:
        """Return approvals still ``approved`` (not run to an end) decided, or last taken by a
        retry, before a moment."""
        return await in_thread(self._approved, decided_before)

    async def expire_due(self, now: datetime, source: str | None = None) -> list[Approval]:
        """Expire every pending request (of ``source`` only, if given) whose time is up at
        ``now``; return them."""
        return await in_thread(self._expire_due, now, source)

    async def set_message(self, approval_id: int, ref: MessageRef) -> None:
        """Remember the chat message that shows the request (to update it later)."""
        await in_thread(self._set_message, approval_id, ref)

    async def get(self, approval_id: int) -> Approval | None:
        """Return one approval or None."""
        return await in_thread(self._get, approval_id)

    async def pending(self) -> list[Approval]:
        """Return every pending approval, oldest first (they survive restarts)."""
        return await in_thread(self._in_state, S.PENDING)

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _create(
        self,
        requester: str,
        requester_name: str,
        node: str,
        request: ApprovalRequest,
        expires_in_s: float,
        source: str,
        now: datetime | None,
    ) -> Approval:
        if expires_in_s <= 0:
            raise ApprovalError(f"an approval must expire in the future, not {expires_in_s}s")
        at = now or datetime.now(UTC)
        expires = at + timedelta(seconds=expires_in_s)
        plan = marshal(request)
        with guard("cannot record the approval request"), write_tx(self._engine) as conn:
            res = conn.execute(
                approvals.insert().values(
                    requester=requester,
                    requester_name=requester_name,
                    source=source,
                    node=node,
                    plan=canonical_json(plan),
                    state=S.PENDING.value,
                    created_at=iso(at),
                    expires_at=iso(expires),
                )
            )
            key = res.inserted_primary_key
            if key is None:
                raise ApprovalError("the database gave the new approval no id")
            aid = int(key[0])
            detail = {"plan": plan, "expires_at": iso(expires), "requester_name": requester_name}
            _audit(conn, Change(aid, node, None, S.PENDING, requester, source, at), detail)
            return self._load(conn, aid)

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
                a = self._load(conn, aid)
                change = Change(aid, a.node, S.PENDING, new, approver, source, now)
                _audit(conn, change, {"by_name": approver_name})
                return a
            row = self._row(conn, aid)
            if row is None:
                error = ApprovalError(f"there is no approval {aid}")
            elif row.requester == approver:
                error = SelfApproval(
                    "you cannot approve your own forced kill: ask another approver"
                    if approve
                    else "you cannot decide your own request: cancel it instead"
                )
            elif row.state != S.PENDING.value:
                error = _already(aid, row)
            else:  # pending, but its time is up: expire it now, then refuse
                self._move_in(conn, aid, (S.PENDING,), S.EXPIRED, "gpubot", "gpubot", now, None)
                error = ApprovalExpired(
                    f"approval {aid} expired at {row.expires_at[11:19]} UTC: request it again"
                )
        raise error

    def _move(
        self,
        aid: int,
        from_: tuple[S, ...],
        to: S,
        by: str,
        source: str,
        now: datetime | None,
        result: Mapping[str, Any] | None,
    ) -> Approval:
        with guard(f"cannot record approval {aid} as {to.value}"), write_tx(self._engine) as conn:
            return self._move_in(conn, aid, from_, to, by, source, now, result)

    def _move_in(
        self,
        conn: Connection,
        aid: int,
        from_: tuple[S, ...],
        to: S,
        by: str,
        source: str,
        now: datetime | None,
        result: Mapping[str, Any] | None,
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
        row = self._row(conn, aid)
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
        _audit(conn, Change(aid, row.node, S(row.state), to, by, source, at), extra)
        return self._load(conn, aid)

    def _expire_due(self, now: datetime, source: str | None) -> list[Approval]:
        out: list[Approval] = []
        due_now = and_(approvals.c.state == S.PENDING.value, approvals.c.expires_at <= iso(now))
        if source is not None:
            due_now = and_(due_now, approvals.c.source == source)
        with guard("cannot expire approvals"), write_tx(self._engine) as conn:
            due = (
                conn.execute(select(approvals.c.id).where(due_now).order_by(approvals.c.id))
                .scalars()
                .all()
            )
            for aid in due:
                out.append(
                    self._move_in(conn, aid, (S.PENDING,), S.EXPIRED, "gpubot", "gpubot", now, None)
                )
        return out

    def _set_message(self, aid: int, ref: MessageRef) -> None:
        with guard("cannot record the approval message"), write_tx(self._engine) as conn:
            changed = conn.execute(approvals.update().where(approvals.c.id == aid).values(ref=ref))
            if changed.rowcount != 1:
                raise ApprovalError(f"there is no approval {aid}")

    def _get(self, aid: int) -> Approval | None:
        with guard("cannot read approvals"), read_tx(self._engine) as conn:
            row = self._row(conn, aid)
            return None if row is None else _approval(row)

    def _in_state(self, state: S) -> list[Approval]:
        with guard("cannot read approvals"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(approvals).where(approvals.c.state == state.value).order_by(approvals.c.id)
            ).all()
            return [_approval(r) for r in rows]

    def _approved(self, before: datetime) -> list[Approval]:
        settled = func.coalesce(approvals.c.taken_at, approvals.c.decided_at)  # the later
        with guard("cannot read approvals"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(approvals)
                .where(approvals.c.state == S.APPROVED.value, settled < iso(before))
                .order_by(approvals.c.id)
            ).all()
            return [_approval(r) for r in rows]

    def _row(self, conn: Connection, aid: int) -> Row[Any] | None:
        return conn.execute(select(approvals).where(approvals.c.id == aid)).one_or_none()

    def _load(self, conn: Connection, aid: int) -> Approval:
        row = self._row(conn, aid)
        if row is None:
            raise ApprovalError(f"there is no approval {aid}")
        return _approval(row)


@dataclass(frozen=True)
class Change:
    """One move of an approval between states: what its audit record says."""

    aid: int
    node: str
    from_: S | None
    to: S
    by: str
    source: str
    at: datetime


def _audit(conn: Connection, change: Change, extra: Mapping[str, Any]) -> None:
    """Record ``change`` (with ``extra``) in the audit log, in the transaction of the change."""
    payload = {
        "approval": change.aid,
        "from": None if change.from_ is None else change.from_.value,
        "to": change.to.value,
        **extra,
    }
    append(
        conn,
        kind="approval",
        actor=change.by,
        source=change.source,
        node=change.node,
        payload=payload,
        now=change.at,
    )


def _already(aid: int, row: Row[Any]) -> ApprovalError:
    if row.state == S.PENDING.value:
        return ApprovalError(f"approval {aid} is still pending")
    who = row.decided_by_name or row.decided_by
    by = f" by {who}" if who and row.state != S.EXPIRED.value else ""
    return AlreadyDecided(f"approval {aid} is already {row.state}{by}")


def marshal(request: ApprovalRequest) -> dict[str, Any]:
    """Return the JSON form of a request, as stored (and as the audit chain records it)."""
    return {
        **request.plan.to_dict(),
        "grace_s": request.grace_s,
        "command": request.command,
        "requester_user": request.requester_user,
    }


def unmarshal(data: Any, approval_id: int) -> ApprovalRequest:
    """Rebuild a request from its stored JSON; raise ``StoreError`` naming the approval if it
    cannot be read. Rows from before a field existed load with its default."""
    try:
        plan = ResetPlan.from_dict(data)
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
    def t(v: str | None) -> datetime | None:
        return None if v is None else parse_iso(v)

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
        decided_at=t(row.decided_at),
        finished_at=t(row.finished_at),
        result=None if row.result is None else json.loads(row.result),
        ref=None if row.ref is None else MessageRef(row.ref),
        taken_at=t(row.taken_at),
    )
