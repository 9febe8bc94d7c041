"""The audit chain's head, posted to the alerts channel or room on a schedule
(``[audit] publish_head_every``): a copy outside the database.

Anyone who can write the database can rewrite the log and recompute its hashes (without
``$GPUBOT_AUDIT_KEY``, undetectably). A head posted to chat earlier cannot be rewritten with it:
``gpubot audit verify --expect-head SEQ:HASH`` checks the log still holds it. Each publication
walks the chain first and posts what it found instead of a head when the log does not verify.
With seals, a head is also posted after every forced action's seal, so the records that matter
most have a copy outside the database at once. Each publication is posted once through the one
outbox (``services.outbox``), on whichever front end it posts; one left unconfirmed is settled by
the next.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Protocol

from gpubot.chat.message import NL, Code, Date, DateStyle, Message, Part, Section, bold, ctx, note
from gpubot.core.alerting import Posted
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock
from gpubot.errors import DUTY_TURN, GpubotError
from gpubot.services.outbox import Outbox

SUBJECT = "audit-head"  # the outbox's name for the head's publications

log = logging.getLogger(__name__)


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


class Verified(HeadCheck, Protocol):
    """A verification with its head's hash (what the next one must still find)."""

    @property
    def head_hash(self) -> str: ...


class Verifier(Protocol):
    """What walks the chain (``gpubot.store.Store``)."""

    async def verify(self, *, published: tuple[int, str] | None = None) -> Verified: ...


class HeadPublisher:
    """Walks the chain and posts its head to one channel or room (what the schedule runs)."""

    def __init__(
        self, store: Verifier, outbox: Outbox[Message], channel: str, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.clock = clock
        self.outbox = outbox
        self.channel = channel
        self.last: tuple[int, str] | None = None  # the head this publisher posted last
        self._lock = asyncio.Lock()  # the schedule and a forced action's seal: one at a time

    async def publish(self) -> Verified | None:
        """Verify the log (it must still hold the last head posted) and post the verdict."""
        async with self._lock:
            try:
                result = await self.store.verify(published=self.last)
            except GpubotError as exc:
                log.error("audit head not published: %s", exc, extra=DUTY_TURN)
                return None
            if result.ok and result.head_seq > 0:
                self.last = (result.head_seq, result.head_hash)
                log.info("audit head %s posted to %s", result.head, self.channel)
            elif not result.ok:
                log.error("%s", result.line())
            now = datetime.fromtimestamp(self.clock.now(), UTC)

            async def send(token: str, repeat_of: datetime | None) -> Posted:
                msg = render_head(result, now, repeat_of)  # its own line says it may repeat
                return await self.outbox.calls(self.channel, msg)[0](token, None)

            try:
                await self.outbox.publish(SUBJECT, send, self.outbox.finder(self.channel), now)
            except GpubotError as exc:  # the outbox cannot be written: nothing was posted
                log.error("audit head not published: %s", exc, extra=DUTY_TURN)
            return result
