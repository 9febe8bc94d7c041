"""Maintenance windows (``core.maint``): one row per window, every change audited with it.

A window is checked against the node's other windows and written under the database-wide write
lock, so two replicas (or two people) never plan overlapping windows of one node.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, select

from gpubot.core.maint import Window, check_new
from gpubot.errors import UsageError
from gpubot.store.audit import append
from gpubot.store.engine import Part, reads, writes
from gpubot.store.records import parse_iso, text_of, unix_of
from gpubot.store.tables import maint_windows as t

KIND = "maint"  # the audit records' kind


class DbMaint(Part):
    """The windows; every method is async and raises ``StoreError``."""

    @reads("cannot read the maintenance windows")
    def live(self, conn: Connection, now: float, node: str | None = None) -> list[Window]:
        """Return the windows not over at ``now`` (open or ahead), of ``node`` or all, by start."""
        q = select(t).where(t.c.ends_at > text_of(now)).order_by(t.c.starts_at, t.c.id)
        if node is not None:
            q = q.where(t.c.node == node)
        return [w for w in map(_window, conn.execute(q)) if w.live_at(now)]

    @writes("cannot record the maintenance window")
    def open(
        self,
        conn: Connection,
        node: str,
        start: float,
        length_s: float,
        reason: str,
        *,
        by: str,
        source: str,
        now: float,
    ) -> Window:
        """Plan a window (``UsageError`` if it overlaps one of the node's), audited."""
        others = [w for w in _of(conn, node) if w.live_at(now)]
        end = check_new(start, length_s, now, others)
        new_id = conn.execute(
            t.insert().values(
                node=node,
                starts_at=text_of(start),
                ends_at=text_of(end),
                reason=reason,
                opened_by=by,
                created_at=text_of(now),
            )
        ).inserted_primary_key
        assert new_id is not None
        w = Window(int(new_id[0]), node, start, end, reason, by, now)
        _audit(conn, w, "opened", by, source, now, {"start": start, "end": end, "reason": reason})
        return w

    @writes("cannot end the maintenance window")
    def end(self, conn: Connection, node: str, *, by: str, source: str, now: float) -> Window:
        """Close the node's open window now (or call off its next one), audited."""
        live = [w for w in _of(conn, node) if w.live_at(now)]
        if not live:
            raise UsageError(f"{node} has no maintenance window open or planned")
        w = min(live, key=lambda x: x.start)
        conn.execute(t.update().where(t.c.id == w.id).values(ended_at=text_of(now), ended_by=by))
        ended = Window(w.id, w.node, w.start, w.end, w.reason, w.by, w.created, now, by)
        what = "ended" if w.start <= now else "called off"
        _audit(conn, ended, what, by, source, now, {"start": w.start, "end": w.end})
        return ended

    @writes("cannot audit the refused maintenance request")
    def refused(
        self, conn: Connection, node: str | None, *, by: str, source: str, asked: str, why: str
    ) -> None:
        """Audit a request refused (not on call): who asked what, and why not."""
        append(
            conn,
            kind=KIND,
            actor=by,
            source=source,
            node=node,
            payload={"maint": "refused", "asked": asked, "why": why},
        )


def _of(conn: Connection, node: str) -> list[Window]:
    return [_window(r) for r in conn.execute(select(t).where(t.c.node == node))]


def _window(r: Row[Any]) -> Window:
    return Window(
        int(r.id),
        r.node,
        unix_of(r.starts_at),
        unix_of(r.ends_at),
        r.reason,
        r.opened_by,
        unix_of(r.created_at),
        None if r.ended_at is None else unix_of(r.ended_at),
        r.ended_by,
    )


def _audit(
    conn: Connection,
    w: Window,
    what: str,
    by: str,
    source: str,
    now: float,
    detail: dict[str, Any],
) -> None:
    append(
        conn,
        kind=KIND,
        actor=by,
        source=source,
        node=w.node,
        now=parse_iso(text_of(now)),
        payload={"maint": what, "window": w.id, **detail},
    )
