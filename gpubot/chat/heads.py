"""The audit chain's head as a message, posted outside the database ([audit] publish_head_every)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from gpubot.chat.blocks import Message, code, context, date, escape, header, section


class HeadCheck(Protocol):
    """What a chain verification says (``gpubot.store.VerifyResult``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def head(self) -> str: ...
    @property
    def head_seq(self) -> int: ...
    @property
    def checked(self) -> int: ...
    def line(self) -> str: ...
    def mode_text(self) -> str: ...


def render_head(result: HeadCheck, at: datetime) -> Message:
    """Render a publication: the verified head and how to check against it, or the failure."""
    when = date(at.timestamp())
    if not result.ok:
        line = escape(result.line())
        return {
            "text": f"⚠ The audit log does not verify: {line}",
            "blocks": [
                header("⚠ Audit log check failed"),
                section(f"*{line}*\nNo head is published until this is explained."),
                context(f"gpubot audit head · {when}"),
            ],
        }
    if result.head_seq == 0:
        text = "The audit log holds no record yet: no head to publish."
        return {"text": text, "blocks": [section(text), context(f"gpubot audit head · {when}")]}
    head = result.head
    return {
        "text": f"Audit log head {head}",
        "blocks": [
            header("Audit log head"),
            section(
                f"{code(head)}\n{result.checked} records, {escape(result.mode_text())}.\n"
                "This message is a copy of the head outside the database: keep it."
            ),
            context(
                "Check the log still holds it: " + code(f"gpubot audit verify --expect-head {head}")
            ),
            context(f"gpubot audit head · {when}"),
        ],
    }
