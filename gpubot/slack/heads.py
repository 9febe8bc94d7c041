"""The audit chain's head, posted to the alerts channel on a schedule: a copy outside the database.

Anyone who can write the database can rewrite the log and recompute its hashes (without
``$GPUBOT_AUDIT_KEY``, undetectably). A head posted to Slack earlier cannot be rewritten with it:
``gpubot audit verify --expect-head SEQ:HASH`` checks the log still holds it. Each publication
walks the chain first and posts what it found instead of a head when the log does not verify.
With seals, a head is also posted after every forced action's seal, so the records that matter
most have a copy outside the database at once. Each publication is posted once through the one
outbox (``services.outbox``); one left unconfirmed is settled by the next.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gpubot.chat.heads import render_head
from gpubot.chat.message import Message
from gpubot.core.alerting import Posted
from gpubot.errors import DUTY_TURN, GpubotError
from gpubot.services.outbox import Outbox
from gpubot.store import Store, VerifyResult

SUBJECT = "audit-head"  # the outbox's name for the head's publications

log = logging.getLogger(__name__)


class HeadPublisher:
    """Walks the chain and posts its head to one channel (what the schedule runs)."""

    def __init__(self, store: Store, outbox: Outbox[Message], channel: str) -> None:
        self.store = store
        self.outbox = outbox
        self.channel = channel
        self.last: tuple[int, str] | None = None  # the head this publisher posted last
        self._lock = asyncio.Lock()  # the schedule and a forced action's seal: one at a time

    async def publish(self) -> VerifyResult | None:
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
            now = datetime.now(UTC)

            async def send(token: str, repeat_of: datetime | None) -> Posted:
                msg = render_head(result, now, repeat_of)  # its own line says it may repeat
                return await self.outbox.calls(self.channel, msg)[0](token, None)

            try:
                await self.outbox.publish(SUBJECT, send, self.outbox.finder(self.channel), now)
            except GpubotError as exc:  # the outbox cannot be written: nothing was posted
                log.error("audit head not published: %s", exc, extra=DUTY_TURN)
            return result
