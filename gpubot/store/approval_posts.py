"""The approval outbox on the database: an approval's post is recorded before it is made.

``begin`` writes a post's intent (its token, where it goes) if its approval is in the state the
post is for and no post of that purpose was recorded for it: one per approval and purpose, ever
(the unique pair is the backstop of the check, made under the write lock). That row is what
makes a re-ping happen once across restarts and replicas. ``finish`` records where the message
is (a request's also on its approval, for the buttons); ``cancel`` records that Slack refused it;
``abandon`` gives up on one nobody can confirm, with an audit record.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from gpubot.core.approval.posts import ApprovalPost, Purpose
from gpubot.core.models import ApprovalState
from gpubot.errors import StoreError
from gpubot.store.audit import append
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.records import iso, parse_iso
from gpubot.store.tables import approval_posts, approvals
from gpubot.store.waits import in_thread

# The states an approval must be in for a post of each purpose to be recorded.
S = ApprovalState
NEEDS = {
    Purpose.REQUEST: {S.PENDING},
    Purpose.REPING: {S.PENDING},
    Purpose.EXPIRED: {S.EXPIRED},
    Purpose.INTERRUPTED: {S.INCOMPLETE},
    Purpose.INTERRUPTED_DM: {S.INCOMPLETE},
    Purpose.WAITING: {S.WAITING, S.APPROVED},  # approved again: a retry under way
    Purpose.GAVE_UP: {S.FAILED},
    Purpose.RETRIED: {S.EXECUTED, S.FAILED},
}


class ApprovalPosts:
    """The approval outbox on one engine; every method is async and raises ``StoreError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def begin(
        self, post: ApprovalPost, *, audit: Mapping[str, Any] | None = None
    ) -> ApprovalPost | None:
        """Record the intent of ``post`` (with ``audit`` in the audit log, in the same
        transaction); None if its approval is not in the state for it, or one of its purpose
        was recorded already."""
        return await in_thread(self._begin, post, audit)

    async def finish(self, token: str, message_ts: str, now: datetime) -> None:
        """Record that the post ``token`` is message ``message_ts`` (found or answered)."""
        await in_thread(self._finish, token, message_ts, now)

    async def cancel(self, token: str, now: datetime) -> None:
        """Record that Slack refused the post ``token``: nothing of it is in the channel."""
        await in_thread(self._end, token, "refused", now, None)

    async def note_repeat(self, token: str) -> None:
        """Record, before it is made, a post that may repeat the post ``token``."""
        await in_thread(self._note_repeat, token)

    async def abandon(self, token: str, why: str, now: datetime) -> None:
        """Give up on the post ``token`` (nobody can tell whether it is there): audited."""
        await in_thread(self._end, token, "abandoned", now, why)

    async def pending(self, created_before: datetime) -> list[ApprovalPost]:
        """Return the posts recorded before a moment and not known to be posted or refused."""
        return await in_thread(self._pending, created_before)

    async def purposes(self, approval_id: int) -> set[Purpose]:
        """Return the purposes of the posts recorded for an approval."""
        return await in_thread(self._purposes, approval_id)

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _begin(self, post: ApprovalPost, audit: Mapping[str, Any] | None) -> ApprovalPost | None:
        with (
            guard("cannot record the approval's post, so it was not posted"),
            write_tx(self._engine) as conn,
        ):
            a = conn.execute(
                select(approvals).where(approvals.c.id == post.approval_id)
            ).one_or_none()
            if a is None or a.state not in NEEDS[post.purpose]:
                return None
            at = iso(post.created_at)
            if post.purpose is Purpose.REPING and not _past_half(a, post.created_at):
                return None
            taken = conn.execute(
                select(approval_posts.c.id).where(
                    approval_posts.c.approval_id == post.approval_id,
                    approval_posts.c.purpose == post.purpose.value,
                )
            ).first()
            if taken is not None:
                return None
            conn.execute(
                approval_posts.insert().values(
                    approval_id=post.approval_id,
                    purpose=post.purpose.value,
                    token=post.token,
                    channel=post.channel,
                    thread_ts=post.thread_ts,
                    created_at=at,
                    state="pending",
                    repeats=0,
                )
            )
            if audit is not None:
                payload = {"approval": post.approval_id, **audit, "token": post.token}
                append(
                    conn,
                    kind="approval",
                    actor="gpubot",
                    source="gpubot",
                    node=a.node,
                    payload=payload,
                    now=post.created_at,
                )
            return _post(_row(conn, post.token))

    def _finish(self, token: str, ts: str, now: datetime) -> None:
        with guard("cannot record the approval's post as posted"), write_tx(self._engine) as conn:
            row = _row(conn, token)
            conn.execute(
                approval_posts.update()
                .where(approval_posts.c.id == row.id)
                .values(state="posted", message_ts=ts, finished_at=iso(now))
            )
            if row.purpose == Purpose.REQUEST.value:  # where its buttons are
                conn.execute(
                    approvals.update()
                    .where(approvals.c.id == row.approval_id)
                    .values(channel=row.channel, message_ts=ts)
                )

    def _end(self, token: str, state: str, now: datetime, why: str | None) -> None:
        with guard(f"cannot record the approval's post as {state}"), write_tx(self._engine) as conn:
            row = _row(conn, token)
            conn.execute(
                approval_posts.update()
                .where(approval_posts.c.id == row.id)
                .values(state=state, finished_at=iso(now))
            )
            if why is None:
                return
            node = conn.execute(
                select(approvals.c.node).where(approvals.c.id == row.approval_id)
            ).scalar()
            append(
                conn,
                kind="approval",
                actor="gpubot",
                source="gpubot",
                node=node,
                now=now,
                payload={
                    "approval": row.approval_id,
                    "post": row.purpose,
                    "not posted": why,
                    "token": token,
                },
            )

    def _note_repeat(self, token: str) -> None:
        with guard("cannot record the repeated approval post"), write_tx(self._engine) as conn:
            row = _row(conn, token)
            conn.execute(
                approval_posts.update()
                .where(approval_posts.c.id == row.id)
                .values(repeats=approval_posts.c.repeats + 1)
            )

    def _pending(self, before: datetime) -> list[ApprovalPost]:
        with guard("cannot read the approval outbox"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(approval_posts)
                .where(
                    approval_posts.c.state == "pending", approval_posts.c.created_at < iso(before)
                )
                .order_by(approval_posts.c.id)
            ).all()
            return [_post(r) for r in rows]

    def _purposes(self, approval_id: int) -> set[Purpose]:
        with guard("cannot read the approval outbox"), read_tx(self._engine) as conn:
            found = conn.execute(
                select(approval_posts.c.purpose).where(approval_posts.c.approval_id == approval_id)
            ).scalars()
            return {Purpose(p) for p in found}


def _past_half(a: Row[Any], now: datetime) -> bool:
    created, expires = parse_iso(a.created_at), parse_iso(a.expires_at)
    return created + (expires - created) / 2 <= now < expires


def _row(conn: Connection, token: str) -> Row[Any]:
    row = conn.execute(select(approval_posts).where(approval_posts.c.token == token)).one_or_none()
    if row is None:
        raise StoreError(f"no approval post {token} was recorded")
    return row


def _post(row: Row[Any]) -> ApprovalPost:
    return ApprovalPost(
        token=row.token,
        approval_id=int(row.approval_id),
        purpose=Purpose(row.purpose),
        channel=row.channel,
        thread_ts=row.thread_ts,
        created_at=parse_iso(row.created_at),
        repeats=int(row.repeats),
    )
