"""A front end's background work: each event's handling runs as a tracked task whose failure is
logged (the event was acknowledged already), and ``drain`` waits for all of them at shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """Tracked background tasks of one front end's bot."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coro`` in the background, tracked, its failure logged."""

        async def guarded() -> None:
            try:
                await coro
            except Exception:
                log.exception("%s failed", what)

        task = asyncio.create_task(guarded(), name=what)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        """Wait until every task, and every task those started, has ended."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
