"""The audit chain's head as a message, posted outside the database ([audit] publish_head_every)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from gpubot.chat.message import NL, Code, Date, DateStyle, Message, Part, Section, bold, ctx, note


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


def render_head(result: HeadCheck, at: datetime, repeat_of: datetime | None = None) -> Message:
    """Render a publication: the verified head and how to check against it, or the failure.
    ``repeat_of``: an earlier publication nobody could check was posted (this may repeat it)."""
    when: Part = ctx(("gpubot audit head · ", Date(at.timestamp())))
    if repeat_of is not None:
        when = ctx(
            (
                "⚠ this may repeat the head posted at ",
                Date(repeat_of.timestamp(), DateStyle.TIME),
                ": gpubot could not read the channel's history to check it · ",
                Date(at.timestamp()),
            )
        )
    if not result.ok:
        line = result.line()
        body = (Section((bold(line), NL, "No head is published until this is explained.")), when)
        return Message("⚠ Audit log check failed", body, f"⚠ The audit log does not verify: {line}")
    if result.head_seq == 0:
        text = "The audit log holds no record yet: no head to publish."
        return Message(None, (*note(text).body, when), text)
    head = result.head
    said = (
        Code(head),
        NL,
        f"{result.checked} records, {result.mode_text()}.",
        NL,
        "This message is a copy of the head outside the database: keep it.",
    )
    check = ("Check the log still holds it: ", Code(f"gpubot audit verify --expect-head {head}"))
    return Message("Audit log head", (Section(said), ctx(check), when), f"Audit log head {head}")
