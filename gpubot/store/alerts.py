"""Alert state of sweep findings on the database; every change is appended to the audit chain."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, select

from gpubot.core.alerting import Alert, MessageRef
from gpubot.core.findings import FindingKey
from gpubot.errors import StoreError
from gpubot.store.audit import append
from gpubot.store.engine import Part, guard, reads, write_tx, writes
from gpubot.store.records import iso, parse_iso, parse_opt
from gpubot.store.tables import alerts
from gpubot.store.waits import in_thread


class DbAlerts(Part):
    """The ``AlertStore`` (``core.ports``) on one engine."""

    async def mark_alerted(self, key: FindingKey, *, ref: MessageRef, now: datetime) -> Alert:
        values = {"alerted_at": iso(now), "ref": ref}
        return await in_thread(self._change, key, now, "alerted", values)

    async def mark_reminded(self, key: FindingKey, now: datetime) -> Alert:
        return await in_thread(self._change, key, now, "reminded", {"reminded_at": iso(now)})

    async def snooze(self, key: FindingKey, until: datetime, *, by: str, now: datetime) -> Alert:
        """Kept if the finding comes back."""
        return await in_thread(self._change, key, now, "snoozed", {"snoozed_until": iso(until)}, by)

    @reads("cannot read alerts")
    def open_alerts(self, conn: Connection) -> list[Alert]:
        q = select(alerts).where(alerts.c.resolved_at.is_(None)).order_by(alerts.c.id)
        return [_alert(r) for r in conn.execute(q).all()]

    @reads("cannot read alerts")
    def on_message(self, conn: Connection, ref: MessageRef) -> list[Alert]:
        q = select(alerts).where(alerts.c.ref == ref).order_by(alerts.c.id)
        return [_alert(r) for r in conn.execute(q).all()]

    @writes("cannot record sweep findings")
    def upsert_seen(
        self, conn: Connection, keys: Iterable[FindingKey], now: datetime
    ) -> list[Alert]:
        at = iso(now)
        out: list[Alert] = []
        for key in dict.fromkeys(keys):  # once each, in order
            row = _row(conn, key)
            if row is None:
                conn.execute(
                    alerts.insert().values(
                        key=key.text(),
                        node=key.node,
                        gpu=key.gpu,
                        kind=key.kind,
                        holder=key.holder,
                        first_seen=at,
                        last_seen=at,
                        seen_count=1,
                    )
                )
            elif row.resolved_at is None:
                conn.execute(
                    alerts.update()
                    .where(alerts.c.id == row.id)
                    .values(last_seen=at, seen_count=alerts.c.seen_count + 1)
                )
            else:  # it came back: a new occurrence; a snooze still holds
                conn.execute(
                    alerts.update()
                    .where(alerts.c.id == row.id)
                    .values(
                        first_seen=at,
                        last_seen=at,
                        seen_count=1,
                        alerted_at=None,
                        ref=None,
                        reminded_at=None,
                        resolved_at=None,
                    )
                )
            out.append(_alert(_must(conn, key)))
        return out

    def _change(
        self, key: FindingKey, now: datetime, what: str, values: dict[str, Any], by: str = "gpubot"
    ) -> Alert:
        with guard(f"cannot record the alert as {what}"), write_tx(self._engine) as conn:
            return _note(conn, _must(conn, key), key, values, {"alert": what, **values}, by, now)

    @writes("cannot resolve alerts")
    def mark_resolved(
        self, conn: Connection, keys: Iterable[FindingKey], now: datetime
    ) -> list[Alert]:
        out: list[Alert] = []
        for key in dict.fromkeys(keys):
            row = _row(conn, key)
            if row is None or row.resolved_at is not None:
                continue
            said = {"alert": "resolved", "seen_count": row.seen_count}
            out.append(_note(conn, row, key, {"resolved_at": iso(now)}, said, "gpubot", now))
        return out


def _note(
    conn: Connection,
    row: Row[Any],
    key: FindingKey,
    values: dict[str, Any],
    said: dict[str, Any],
    by: str,
    now: datetime,
) -> Alert:
    """Set ``values`` on ``key``'s row and audit ``said`` of it, in one transaction."""
    conn.execute(alerts.update().where(alerts.c.id == row.id).values(**values))
    payload = {"key": key.text(), **said}
    append(conn, kind="alert", actor=by, source="gpubot", node=key.node, now=now, payload=payload)
    return _alert(_must(conn, key))


def _row(conn: Connection, key: FindingKey) -> Row[Any] | None:
    return conn.execute(select(alerts).where(alerts.c.key == key.text())).one_or_none()


def _must(conn: Connection, key: FindingKey) -> Row[Any]:
    row = _row(conn, key)
    if row is None:
        raise StoreError(f"no finding {key.text()} was seen")
    return row


def _alert(row: Row[Any]) -> Alert:
    return Alert(
        id=int(row.id),
        key=FindingKey(row.node, None if row.gpu is None else int(row.gpu), row.kind, row.holder),
        first_seen=parse_iso(row.first_seen),
        last_seen=parse_iso(row.last_seen),
        seen_count=int(row.seen_count),
        alerted_at=parse_opt(row.alerted_at),
        ref=None if row.ref is None else MessageRef(row.ref),
        reminded_at=parse_opt(row.reminded_at),
        snoozed_until=parse_opt(row.snoozed_until),
        resolved_at=parse_opt(row.resolved_at),
    )
