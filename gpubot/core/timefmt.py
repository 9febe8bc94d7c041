"""Times as text: one ISO 8601 form (UTC, ending in ``Z``) for messages, JSON and the store."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(t: datetime | float, *, timespec: str = "seconds") -> str:
    """Render a unix time or an aware datetime as UTC ISO 8601 text ending in ``Z``.

    ``timespec`` as ``datetime.isoformat`` takes it: "seconds", "milliseconds", "microseconds"
    (fixed width: the store's form, whose text order is time order).
    """
    moment = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
