"""An error as a person reads it: one line, never a traceback."""

from __future__ import annotations

from gpubot.chat.message import Message, Sentence, note
from gpubot.errors import (
    ApprovalError,
    GpubotError,
    NotPermitted,
    StoreError,
    TransportError,
    UsageError,
)


def error_message(exc: BaseException) -> Message:
    """Render an error for a person, one line."""
    said = Sentence(str(exc))
    if isinstance(exc, UsageError):
        return note("⚠ ", said)
    if isinstance(exc, NotPermitted | ApprovalError):
        return note("⛔ ", said)
    if isinstance(exc, StoreError):
        return note("🛑 The audit log is unavailable, so nothing was done: ", said)
    if isinstance(exc, TransportError):
        return note("📡 ", said)
    if isinstance(exc, GpubotError):
        return note("⚠ ", said)
    return note("💥 Internal error: the details are in gpubot's log")
