"""The outbox on the database: every post that must appear once is recorded before it is made.

``begin`` writes a post's intent (its token, subject, where it goes) and what it changes, in one
transaction: an alert's findings are marked alerted (so no later sweep posts them again,
whatever happens to the post); an approval's post is recorded only while its approval is in the
state for it, once per approval and purpose (``core.approval.posts``), with its audit record. A
subject posted ``once`` is one row ever (the unique ``once`` column is the backstop of the check
made under the write lock).

Every change after that is a compare-and-set on the caller's take (``taken_at``): ``take`` hands
a stale pending row to one caller; ``finish`` records where it landed (an alert's findings and
an approval's request learn it too), ``cancel`` that it was refused (an alert's findings are
not alerted), ``abandon`` that nobody can tell (audited). A change that finds another take, or
a settled row, changes nothing: the newer take decides, and a row ``posted`` never changes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, select
from sqlalchemy.exc import IntegrityError

from gpubot.core.alerting import Intent, MessageRef, PendingPost
from gpubot.core.approval.posts import Purpose, may_record, parse_subject
from gpubot.core.findings import FindingKey
from gpubot.core.health.kinds import parse_key
from gpubot.core.models import ApprovalState
from gpubot.errors import StoreError
from gpubot.store.audit import append
from gpubot.store.engine import Part, reads, writes
from gpubot.store.records import iso, parse_iso
from gpubot.store.tables import alerts, approvals, outbox

log = logging.getLogger(__name__)

NO_KEYS = "[]"  # the keys of a post that alerts no finding
# A take later than now by more than this was made before the wall clock stepped back: stale.
CLOCK_STEP_S = 300.0
c = outbox.c


class DbOutbox(Part):
    """The ``OutboxStore`` (``core.ports``) on one engine."""

    async def begin(self, intent: Intent) -> PendingPost | None:
        """None also when an alert's findings are all alerted, an approval is not in the state
        for the post, or a ``once`` subject is posted or being posted."""
        try:
            return await self._begin(intent)
        except StoreError as exc:
            if intent.once and isinstance(exc.__cause__, IntegrityError):
                return None  # another replica recorded it first
            raise

    @writes("cannot record the post, so it was not posted")
    def _begin(self, conn: Connection, intent: Intent) -> PendingPost | None:
        since, keys = intent.at, intent.keys
        if keys:
            marked = _mark_alerted(conn, intent)
            if marked is None:
                return None
            since, keys = marked
        about = parse_subject(intent.subject)
        node = None if about is None else _approval_node(conn, about, intent.at)
        if about is not None and node is None:
            return None
        if intent.once:
            row = conn.execute(select(outbox).where(c.once == intent.subject)).one_or_none()
            if row is not None:
                return _retake(conn, row, intent)
        at = iso(intent.at)
        conn.execute(
            outbox.insert().values(
                token=intent.token,
                subject=intent.subject,
                once=intent.subject if intent.once else None,
                keys=json.dumps([k.text() for k in keys]),
                destination=intent.to,
                since=iso(since),
                created_at=at,
                taken_at=at,
                state="pending",
                repeats=0,
            )
        )
        if intent.audit is not None:
            payload = {**_about(about), **intent.audit, "token": intent.token}
            _audit_post(conn, about, node, payload, intent.at)
        return replace(_pending(_row(conn, intent.token)), audit=intent.audit)

    @writes("cannot take the post")
    def take(
        self, conn: Connection, token: str, stale_before: datetime, now: datetime
    ) -> PendingPost | None:
        """None: it is settled, or another caller holds a newer take."""
        row = _row(conn, token)
        if row.state != "pending" or _held(row, stale_before, now):
            return None
        moved = conn.execute(
            outbox.update()
            .where(c.id == row.id, c.state == "pending", c.taken_at == row.taken_at)
            .values(taken_at=iso(now))
        )
        if moved.rowcount != 1:
            return None
        return replace(_pending(row), taken_at=now, fresh=False)

    @writes("cannot record the post as posted")
    def finish(
        self,
        conn: Connection,
        post: PendingPost,
        ref: MessageRef,
        now: datetime,
        *,
        adopted: bool = False,
    ) -> list[FindingKey]:
        """``adopted``: found in the history, not answered; none alerted when another take
        holds it."""
        row = _settle(conn, post, state="posted", ref=ref, finished_at=iso(now))
        if row is None:
            return []
        _audit_end(conn, post, now, {"outcome": "posted", "ref": ref})
        about = parse_subject(row.subject)
        if about is not None and about[1] is Purpose.REQUEST:  # where its buttons are
            conn.execute(approvals.update().where(approvals.c.id == about[0]).values(ref=ref))
        return _alerted(conn, row, ref, now, adopted)

    @writes("cannot record the refused post")
    def cancel(self, conn: Connection, post: PendingPost, now: datetime) -> None:
        """Nothing of ``post`` is there: its findings are not alerted."""
        row = _settle(conn, post, state="refused", finished_at=iso(now))
        if row is None:
            return
        _audit_end(conn, post, now, {"outcome": "refused"})
        if row.keys == NO_KEYS:
            return
        conn.execute(
            alerts.update()
            .where(
                alerts.c.key.in_(json.loads(row.keys)),
                alerts.c.ref.is_(None),
                alerts.c.alerted_at == row.created_at,
            )
            .values(alerted_at=None)
        )

    @writes("cannot record the abandoned post")
    def abandon(self, conn: Connection, post: PendingPost, why: str, now: datetime) -> None:
        """Nobody can tell whether ``post`` is there."""
        row = _settle(conn, post, state="abandoned", finished_at=iso(now))
        if row is None:
            return
        about = parse_subject(row.subject)
        if about is not None:
            node = _node(conn, about)
            payload = {"approval": about[0], "post": str(about[1]), "not posted": why}
        else:
            message = row.keys == NO_KEYS
            node = None if message else row.subject.removeprefix("alert:")
            payload = {"alert": "not posted", "keys": json.loads(row.keys), "why": why}
            payload |= {"message": row.subject} if message else {}
        _audit_post(conn, about, node, {**payload, "token": row.token}, now)

    @writes("cannot record the repeated post")
    def note_repeat(self, conn: Connection, token: str) -> None:
        row = _row(conn, token)
        conn.execute(
            outbox.update()
            .where(c.id == row.id, c.state == "pending")
            .values(repeats=c.repeats + 1)
        )

    @reads("cannot read the outbox")
    def pending(self, conn: Connection, subject: str, *, under: bool = False) -> list[PendingPost]:
        """Oldest first; pending: not known posted, refused or given up."""
        which = c.subject.startswith(subject, autoescape=True) if under else c.subject == subject
        q = select(outbox).where(c.state == "pending", which).order_by(c.id)
        return [_pending(r) for r in conn.execute(q).all()]

    @reads("cannot read the outbox")
    def recorded(self, conn: Connection, subject: str) -> bool:
        return conn.execute(select(c.id).where(c.once == subject)).first() is not None


def _mark_alerted(
    conn: Connection, intent: Intent
) -> tuple[datetime, tuple[FindingKey, ...]] | None:
    """Mark the intent's findings not alerted yet (nor resolved) alerted; return the first
    sighting of those and their keys, or None if there are none."""
    rows = [
        r
        for k in dict.fromkeys(intent.keys)
        if (r := conn.execute(select(alerts).where(alerts.c.key == k.text())).one_or_none())
        is not None
        and r.alerted_at is None
        and r.resolved_at is None
    ]
    if not rows:
        return None
    conn.execute(
        alerts.update()
        .where(alerts.c.id.in_([r.id for r in rows]))
        .values(alerted_at=iso(intent.at))
    )
    first = min(parse_iso(r.first_seen) for r in rows)
    return first, tuple(parse_key(r.key) for r in rows)


def _held(row: Row[Any], stale_before: datetime, now: datetime) -> bool:
    """Whether the pending ``row``'s take is still held: made after ``stale_before``, and not
    so far after ``now`` that the clock must have stepped back since (a step back never
    silences a post)."""
    taken = parse_iso(row.taken_at)
    return stale_before < taken <= now + timedelta(seconds=CLOCK_STEP_S)


def _approval_node(conn: Connection, about: tuple[int, Purpose], at: datetime) -> str | None:
    """Return the node of the approval an approval's post is for, if the post may be recorded
    at ``at`` (its state, and a re-ping's time); else None."""
    a = conn.execute(select(approvals).where(approvals.c.id == about[0])).one_or_none()
    if a is None:
        return None
    created, expires = parse_iso(a.created_at), parse_iso(a.expires_at)
    if not may_record(about[1], ApprovalState(a.state), created, expires, at):
        return None
    return str(a.node)


def _retake(conn: Connection, row: Row[Any], intent: Intent) -> PendingPost | None:
    """A ``once`` subject recorded before: hand it over if the intent may take it again (it
    was refused, given up, or left pending since before ``retake_before``), else None."""
    stale = intent.retake_before
    if stale is None or row.state == "posted":
        return None
    if row.state == "pending" and _held(row, stale, intent.at):
        return None  # being done
    moved = conn.execute(
        outbox.update()
        .where(c.id == row.id, c.state == row.state, c.taken_at == row.taken_at)
        .values(state="pending", taken_at=iso(intent.at), finished_at=None)
    )
    if moved.rowcount != 1:
        return None
    # Refused: it is not there, so posted afresh; otherwise the history is searched first.
    fresh = row.state == "refused"
    return replace(_pending(row), taken_at=intent.at, fresh=fresh, audit=intent.audit)


def _alerted(
    conn: Connection, row: Row[Any], ref: MessageRef, now: datetime, adopted: bool
) -> list[FindingKey]:
    """Record ``ref`` on the findings the post ``row`` alerted (audited); return their keys."""
    done: list[FindingKey] = []
    for text in json.loads(row.keys):
        a = conn.execute(select(alerts).where(alerts.c.key == text)).one_or_none()
        if a is None or a.ref is not None:
            continue
        conn.execute(
            alerts.update()
            .where(alerts.c.id == a.id)
            .values(ref=ref, alerted_at=a.alerted_at or iso(now))
        )
        payload: dict[str, Any] = {"alert": "alerted", "key": text, "token": row.token, "ref": ref}
        if adopted:
            payload["adopted"] = True
        _audit_post(conn, None, a.node, payload, now)
        done.append(parse_key(text))
    return done


def _audit_end(conn: Connection, post: PendingPost, now: datetime, end: dict[str, Any]) -> None:
    """Audit how a post whose intent was audited ended, beside its intent's record."""
    if post.audit is None:
        return
    about = parse_subject(post.subject)
    node = None if about is None else _node(conn, about)
    payload = {**_about(about), **post.audit, **end, "token": post.token}
    _audit_post(conn, about, node, payload, now)


def _audit_post(
    conn: Connection,
    about: tuple[int, Purpose] | None,
    node: str | None,
    payload: dict[str, Any],
    now: datetime,
) -> None:
    """Append a post's audit record: an approval's (``about`` names it) or an alert's."""
    kind = "alert" if about is None else "approval"
    append(conn, kind=kind, actor="gpubot", source="gpubot", node=node, payload=payload, now=now)


def _node(conn: Connection, about: tuple[int, Purpose]) -> str | None:
    return conn.execute(select(approvals.c.node).where(approvals.c.id == about[0])).scalar()


def _about(about: tuple[int, Purpose] | None) -> dict[str, Any]:
    return {} if about is None else {"approval": about[0]}


def _row(conn: Connection, token: str) -> Row[Any]:
    row = conn.execute(select(outbox).where(c.token == token)).one_or_none()
    if row is None:
        raise StoreError(f"no post {token} was recorded")
    return row


def _settle(conn: Connection, post: PendingPost, **values: str) -> Row[Any] | None:
    """Change ``post`` if it is still pending on the caller's take (compare and set); return
    its row as it was, or None: another take holds it, or it is settled."""
    row = _row(conn, post.token)
    moved = conn.execute(
        outbox.update()
        .where(c.id == row.id, c.state == "pending", c.taken_at == iso(post.take))
        .values(**values)
    )
    if moved.rowcount == 1:
        return row
    log.warning(
        "post %s: %s from a take of %s ignored; the row is %s, taken %s",
        post.token,
        values["state"],
        iso(post.take),
        row.state,
        row.taken_at,
    )
    return None


def _pending(row: Row[Any]) -> PendingPost:
    return PendingPost(
        token=row.token,
        subject=row.subject,
        keys=tuple(parse_key(t) for t in json.loads(row.keys)),
        since=parse_iso(row.since),
        created_at=parse_iso(row.created_at),
        repeats=int(row.repeats),
        taken_at=parse_iso(row.taken_at),
        to=row.destination,
    )
