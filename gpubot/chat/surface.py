"""Where a flow's messages go (``Surface``), and how a long answer's progress edits are spaced."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from gpubot.chat.message import Message
from gpubot.core.alerting import MessageRef
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock

log = logging.getLogger(__name__)

__all__ = ["MIN_UPDATE_S", "MessageRef", "Progress", "Surface"]

# Progress edits of one message are spaced at least this much: Slack's chat.update is rate
# limited per workspace (Tier 3), shared by every answer at once. The final answer is not held.
MIN_UPDATE_S = 2.5


class Surface(Protocol):
    """Where a flow's messages go; implementations log their own failures and never raise."""

    async def reply(self, msg: Message) -> None:
        """Answer only the person who asked (ephemeral)."""
        ...

    async def post(self, msg: Message, *, channel: str | None = None) -> MessageRef | None:
        """Post a message where the person asked (or in ``channel``); None if it failed."""
        ...

    async def update(self, handle: MessageRef | None, msg: Message) -> MessageRef | None:
        """Replace a message (or post anew if that fails); return where it now is."""
        ...


class Progress:
    """Coalesces the progress edits of one message: at most one in flight, one per ``interval``
    (the first too: the caller just wrote it), each rendering the latest state. ``stop`` ends at
    once: the caller's final answer supersedes any edit still pending."""

    def __init__(
        self,
        out: Surface,
        handle: MessageRef | None,
        render: Callable[[], Message],
        interval: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.out = out
        self.handle = handle
        self.render = render
        self.interval = interval
        self.clock = clock
        self.last = clock.monotonic()  # when the message was last written
        self.dirty = asyncio.Event()
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(self._loop())

    def poke(self) -> None:
        self.dirty.set()

    async def _loop(self) -> None:
        while True:
            await self.dirty.wait()
            wait = self.last + self.interval - self.clock.monotonic()
            if self.stopping.is_set() or (wait > 0 and await self._stopped_within(wait)):
                return
            # ``stop`` may have run while the wait unwound: check again before the
            # clear (nothing awaits between the check and the clear), or its wake-up is lost.
            if self.stopping.is_set():
                return
            self.dirty.clear()  # what is rendered now includes every event so far
            if self.handle is None:  # nothing to update in place: only the final answer goes
                continue
            try:
                self.handle = await self.out.update(self.handle, self.render())
            except Exception:  # progress is best effort; the final update tells the outcome
                log.exception("progress update failed")
            # Spaced from the call's end: a slow call is no burst.
            self.last = self.clock.monotonic()

    async def _stopped_within(self, seconds: float) -> bool:
        stopped = asyncio.ensure_future(self.stopping.wait())
        slept = asyncio.ensure_future(self.clock.sleep(seconds))
        try:
            await asyncio.wait((stopped, slept), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stopped, slept):
                task.cancel()
        return self.stopping.is_set()

    async def stop(self) -> MessageRef | None:
        """Stop updating (an update in flight finishes); return where the message is."""
        self.stopping.set()
        self.dirty.set()
        await self.task
        return self.handle
