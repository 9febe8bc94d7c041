"""The alert outbox on the database: an alert post is recorded before it is made.

``begin_post`` writes the post's intent (its token, node, findings) and the findings' state
change (``alerted_at``) in one transaction, so that no later sweep posts them again whatever
happens to the post; ``finish_post`` records where the message is, or that a search of the
channel's history found it (adopted); ``cancel_post`` undoes the state change of a post Slack
refused, so the next sweep tries again; ``abandon_post`` gives up on one nobody can confirm.
``DbAlerts`` (``store.alerts``) mixes these in: they are part of the ``AlertStore`` port.

The same rows hold the posts of single messages that must appear once and carry no finding
(the audit head's publications): ``begin_message`` records one under a subject (no keys), and
``pending_posts(subject)`` returns only those; ``pending_posts()`` only the alerts'. A message
due once whatever process sees it due (a hold's DM, issue 34) has a token made from its subject:
``begin_once`` records it only if no row has that token, or hands over a row left pending,
refused or given up (a DM that failed is tried again while it is due); a posted one, never.

Each change after a take (``finish_post``, ``cancel_post``, ``abandon_post``) is a compare-and-set
on the caller's take: the row must still be pending with the ``created_at`` its take wrote. A
poster whose slow send outlived ``SETTLE_S`` has lost the row to a replica's take; its late
"refused" must not turn that replica's ``posted`` row into one taken and posted again. A change
that finds another take (or a settled row) changes nothing: the newer take decides, and a row
``posted`` is never changed again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, select

from gpubot.core.alerting import PendingPost
from gpubot.core.findings import FindingKey
from gpubot.core.health.kinds import parse_key
from gpubot.errors import StoreError
from gpubot.store.audit import append
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.records import iso, parse_iso
from gpubot.store.tables import alert_posts, alerts
from gpubot.store.waits import in_thread

log = logging.getLogger(__name__)

NO_KEYS = "[]"  # the keys of a message post: it alerts no finding


class OutboxMixin:
    """The outbox half of ``DbAlerts``; every method is async and raises ``StoreError``."""

    _engine: Engine

    async def begin_post(
        self, token: str, node: str, keys: Sequence[FindingKey], now: datetime
    ) -> PendingPost | None:
        """Record the intent to post an alert on ``keys`` (those not alerted yet), and mark
        them alerted, in one transaction; return the intent, or None if none is left."""
        return await in_thread(self._begin_post, token, node, list(keys), now)

    async def begin_message(self, token: str, subject: str, now: datetime) -> PendingPost:
        """Record the intent to post one message of ``subject`` (no finding: a head)."""
        return await in_thread(self._begin_message, token, subject, now)

    async def begin_once(
        self, token: str, subject: str, now: datetime, stale_before: datetime
    ) -> tuple[PendingPost, bool] | None:
        """Record the intent to post the message ``token`` of ``subject`` unless a row has that
        token: return it and True. A row of it refused (not posted) is taken again the same way.
        A row still pending since before ``stale_before`` (its poster died, or could not confirm
        it), or given up (nobody could tell whether it was posted), is handed over: returned
        with False, pending again and marked taken (its time is now), so one caller settles it,
        searching the history first. Otherwise None: it is posted, or being done."""
        return await in_thread(self._begin_once, token, subject, now, stale_before)

    async def finish_post(
        self,
        token: str,
        channel: str,
        message_ts: str,
        now: datetime,
        *,
        taken: datetime,
        adopted: bool = False,
    ) -> list[FindingKey]:
        """Record that the post ``token`` is message ``message_ts`` in ``channel`` (``adopted``:
        found in the history, not answered) while it is pending on the take ``taken``; return
        the keys it alerted (none if another take holds it: that one decides)."""
        where = (channel, message_ts)
        return await in_thread(self._finish_post, token, where, now, taken, adopted)

    async def cancel_post(self, token: str, now: datetime, *, taken: datetime) -> None:
        """Record that Slack refused the post ``token``: its findings are not alerted (only
        while it is pending on the take ``taken``)."""
        await in_thread(self._cancel_post, token, now, taken)

    async def note_repeat(self, token: str) -> None:
        """Record, before it is made, a post that may repeat the post ``token``."""
        await in_thread(self._note_repeat, token)

    async def abandon_post(self, token: str, why: str, now: datetime, *, taken: datetime) -> None:
        """Give up on the post ``token`` (nobody can tell whether it is in the channel), only
        while it is pending on the take ``taken``."""
        await in_thread(self._abandon_post, token, why, now, taken)

    async def pending_posts(self, subject: str | None = None) -> list[PendingPost]:
        """Return the alert posts (or, with ``subject``, that subject's message posts)
        recorded and not known to be posted or refused, oldest first."""
        return await in_thread(self._pending, subject)

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _begin_post(
        self, token: str, node: str, keys: list[FindingKey], now: datetime
    ) -> PendingPost | None:
        at = iso(now)
        with (
            guard("cannot record the alert post, so it was not posted"),
            write_tx(self._engine) as conn,
        ):
            rows = [
                r
                for k in dict.fromkeys(keys)
                if (r := _alert_row(conn, k)) is not None
                and r.alerted_at is None
                and r.resolved_at is None
            ]
            if not rows:
                return None
            conn.execute(
                alerts.update().where(alerts.c.id.in_([r.id for r in rows])).values(alerted_at=at)
            )
            since = min(r.first_seen for r in rows)
            texts = [r.key for r in rows]
            conn.execute(
                alert_posts.insert().values(
                    token=token,
                    node=node,
                    keys=json.dumps(texts),
                    since=since,
                    created_at=at,
                    state="pending",
                    repeats=0,
                )
            )
            return _pending(_post_row(conn, token))

    def _begin_message(self, token: str, subject: str, now: datetime) -> PendingPost:
        at = iso(now)
        with guard("cannot record the post, so it was not posted"), write_tx(self._engine) as conn:
            conn.execute(
                alert_posts.insert().values(
                    token=token,
                    node=subject,
                    keys=NO_KEYS,
                    since=at,
                    created_at=at,
                    state="pending",
                    repeats=0,
                )
            )
            return _pending(_post_row(conn, token))

    def _begin_once(
        self, token: str, subject: str, now: datetime, stale_before: datetime
    ) -> tuple[PendingPost, bool] | None:
        c = alert_posts.c
        with guard("cannot record the post, so it was not posted"), write_tx(self._engine) as conn:
            row = conn.execute(select(alert_posts).where(c.token == token)).one_or_none()
            if row is None:
                conn.execute(
                    alert_posts.insert().values(
                        token=token,
                        node=subject,
                        keys=NO_KEYS,
                        since=iso(now),
                        created_at=iso(now),
                        state="pending",
                        repeats=0,
                    )
                )
                return _pending(_post_row(conn, token)), True
            if row.state == "posted":
                return None
            if row.state == "pending" and parse_iso(row.created_at) >= stale_before:
                return None  # being done
            # Taken again: left pending, refused (it is not there: posted afresh), or given up
            # (nobody knew: the history is searched before anything is posted again).
            conn.execute(
                alert_posts.update()
                .where(c.id == row.id, c.state == row.state, c.created_at == row.created_at)
                .values(state="pending", created_at=iso(now), finished_at=None)
            )
            # its first post's time: "may repeat"; the take is now
            return replace(_pending(row), taken_at=now), row.state == "refused"

    def _finish_post(
        self, token: str, where: tuple[str, str], now: datetime, taken: datetime, adopted: bool
    ) -> list[FindingKey]:
        channel, ts = where
        with guard("cannot record the alert as posted"), write_tx(self._engine) as conn:
            post = _settle(
                conn,
                token,
                taken,
                state="posted",
                channel=channel,
                message_ts=ts,
                finished_at=iso(now),
            )
            if post is None:
                return []
            done: list[FindingKey] = []
            for text in json.loads(post.keys):
                row = conn.execute(select(alerts).where(alerts.c.key == text)).one_or_none()
                if row is None or row.message_ts is not None:
                    continue
                conn.execute(
                    alerts.update()
                    .where(alerts.c.id == row.id)
                    .values(channel=channel, message_ts=ts, alerted_at=row.alerted_at or iso(now))
                )
                payload: dict[str, Any] = {
                    "alert": "alerted",
                    "key": text,
                    "token": token,
                    "channel": channel,
                    "message_ts": ts,
                }
                if adopted:
                    payload["adopted"] = True
                append(
                    conn,
                    kind="alert",
                    actor="gpubot",
                    source="gpubot",
                    node=row.node,
                    now=now,
                    payload=payload,
                )
                done.append(parse_key(text))
            return done

    def _cancel_post(self, token: str, now: datetime, taken: datetime) -> None:
        with guard("cannot record the refused alert post"), write_tx(self._engine) as conn:
            post = _settle(conn, token, taken, state="refused", finished_at=iso(now))
            if post is None:
                return
            conn.execute(
                alerts.update()
                .where(
                    alerts.c.key.in_(json.loads(post.keys)),
                    alerts.c.message_ts.is_(None),
                    alerts.c.alerted_at == post.created_at,
                )
                .values(alerted_at=None)
            )

    def _note_repeat(self, token: str) -> None:
        with guard("cannot record the repeated alert post"), write_tx(self._engine) as conn:
            post = _post_row(conn, token)
            conn.execute(
                alert_posts.update()
                .where(alert_posts.c.id == post.id, alert_posts.c.state == "pending")
                .values(repeats=alert_posts.c.repeats + 1)
            )

    def _abandon_post(self, token: str, why: str, now: datetime, taken: datetime) -> None:
        with guard("cannot record the abandoned alert post"), write_tx(self._engine) as conn:
            post = _settle(conn, token, taken, state="abandoned", finished_at=iso(now))
            if post is None:
                return
            append(
                conn,
                kind="alert",
                actor="gpubot",
                source="gpubot",
                node=None if post.keys == NO_KEYS else post.node,
                now=now,
                payload={
                    "alert": "not posted",
                    "keys": json.loads(post.keys),
                    "token": token,
                    "why": why,
                    **({"message": post.node} if post.keys == NO_KEYS else {}),
                },
            )

    def _pending(self, subject: str | None) -> list[PendingPost]:
        c = alert_posts.c
        keys = c["keys"]
        which = keys != NO_KEYS if subject is None else and_(keys == NO_KEYS, c.node == subject)
        with guard("cannot read the alert outbox"), read_tx(self._engine) as conn:
            rows = conn.execute(
                select(alert_posts).where(c.state == "pending", which).order_by(c.id)
            ).all()
            return [_pending(r) for r in rows]


def _alert_row(conn: Connection, key: FindingKey) -> Row[Any] | None:
    return conn.execute(select(alerts).where(alerts.c.key == key.text())).one_or_none()


def _post_row(conn: Connection, token: str) -> Row[Any]:
    row = conn.execute(select(alert_posts).where(alert_posts.c.token == token)).one_or_none()
    if row is None:
        raise StoreError(f"no alert post {token} was recorded")
    return row


def _settle(conn: Connection, token: str, taken: datetime, **values: str) -> Row[Any] | None:
    """Change the post ``token`` if it is still pending on the take ``taken`` (compare and set);
    return its row as it was, or None (changed nothing): another take holds it, or it is
    settled (a ``posted`` row is never changed again)."""
    post = _post_row(conn, token)
    c = alert_posts.c
    moved = conn.execute(
        alert_posts.update()
        .where(c.id == post.id, c.state == "pending", c.created_at == iso(taken))
        .values(**values)
    )
    if moved.rowcount == 1:
        return post
    log.warning(
        "post %s: %s from a take of %s ignored; the row is %s since %s",
        token,
        values["state"],
        iso(taken),
        post.state,
        post.created_at,
    )
    return None


def _pending(row: Row[Any]) -> PendingPost:
    return PendingPost(
        token=row.token,
        node=row.node,
        keys=tuple(parse_key(t) for t in json.loads(row.keys)),
        since=parse_iso(row.since),
        created_at=parse_iso(row.created_at),
        repeats=int(row.repeats),
    )
