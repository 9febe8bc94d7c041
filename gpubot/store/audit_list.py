"""The queries of ``audit list``: actions by node, actor and time, through indexes.

A listing must not walk the log. ``--since`` is also a bound on ``seq`` (through the
``created_at`` index), so a node with few actions in the window does not walk its whole history.
The bound is the least seq of every record at or after that time, so it does not rely on
records being appended in time order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ScalarSelect, Select, and_, func, literal_column, select

from gpubot.store.records import iso
from gpubot.store.tables import audit_log


def since_bound(since: datetime) -> ScalarSelect[Any]:
    """Return the least seq of the records at or after ``since`` (NULL: none).

    ``min(seq + 0)``, not ``min(seq)``: SQLite answers a bare ``min(seq)`` by walking the
    primary key from the first record; an expression makes it read the ``created_at`` index.
    """
    first = func.min(audit_log.c.seq + literal_column("0"))
    return select(first).where(audit_log.c.created_at >= iso(since)).scalar_subquery()


def summaries_query(
    *, node: str | None = None, actor: str | None = None, since: datetime | None = None, limit: int
) -> Select[Any]:
    """Return the query of actions (intents with their outcome), newest first."""
    outcome = audit_log.alias("outcome")
    q = (
        select(audit_log, outcome.c.payload.label("o_payload"), outcome.c.created_at.label("o_at"))
        .select_from(
            audit_log.outerjoin(
                outcome,
                and_(outcome.c.action_id == audit_log.c.action_id, outcome.c.kind == "outcome"),
            )
        )
        .where(audit_log.c.kind == "intent")
        .order_by(audit_log.c.seq.desc())
    )
    return narrow(q, node, actor, since).limit(limit)


def narrow(
    q: Select[Any], node: str | None, actor: str | None, since: datetime | None
) -> Select[Any]:
    """Return ``q`` cut to ``node``, to actors that hold ``actor``, and to ``since`` on."""
    if node is not None:
        q = q.where(audit_log.c.node == node)
    if actor is not None:
        q = q.where(audit_log.c.actor.contains(actor, autoescape=True))
    if since is not None:
        q = q.where(audit_log.c.created_at >= iso(since), audit_log.c.seq >= since_bound(since))
    return q
