"""Direct messages handed from one front end's process to another's (``chat.dm_route``): one
row per message, by its outbox subject, until the process whose front end reaches the person
has posted it (once, through the outbox) or given it up. Not audited: what was sent is the
outbox's, and a row is deleted once it is."""

from __future__ import annotations

from sqlalchemy import Connection, delete, select

from gpubot.core.ports import DueDm
from gpubot.store.engine import Part, reads, writes
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import dm_due as t


class DbDmDue(Part):
    """The handed-over DMs; every method is async and raises ``StoreError``."""

    @writes("cannot hand the direct message over")
    def hand(self, conn: Connection, dm: DueDm) -> bool:
        if conn.execute(select(t.c.id).where(t.c.subject == dm.subject)).first() is not None:
            return False
        row = dict(subject=dm.subject, chat_id=dm.to, body=dm.body, created_at=text_of(dm.at))
        conn.execute(t.insert().values(**row))
        return True

    @reads("cannot read the direct messages handed over")
    def due(self, conn: Connection) -> list[DueDm]:
        rows = conn.execute(select(t).order_by(t.c.id))
        return [DueDm(r.subject, r.chat_id, r.body, unix_of(r.created_at)) for r in rows]

    @writes("cannot forget a direct message handed over")
    def done(self, conn: Connection, subject: str) -> None:
        conn.execute(delete(t).where(t.c.subject == subject))
