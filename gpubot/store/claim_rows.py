"""Times and audit records of claims and the queue (``store.claims``, ``store.claim_waits``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from gpubot.store.audit import append
from gpubot.store.records import iso, parse_iso

KIND = "claim"  # the audit records' kind


def at(t: float) -> str:
    """Return the store's text of unix time ``t``."""
    return iso(datetime.fromtimestamp(t, UTC))


def unix(text: str | None) -> float | None:
    """Return unix time of the store's text (None stays None)."""
    return None if text is None else parse_iso(text).timestamp()


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
