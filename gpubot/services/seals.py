"""The audit log's seals while the bot runs: a keyed seal at start, at every interval (the
app's scheduler runs ``periodic``), after every forced action, and at a clean stop.

A seal is written every interval even when nothing happened, or a quiet log and a cut one would
look the same to ``audit verify``. A seal that finds the log no longer holds this bot's last
record is still written, naming it, so the chain itself says so; the finding is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gpubot.errors import GpubotError

log = logging.getLogger(__name__)


class WrittenSeal(Protocol):
    """What appending a seal reports (``gpubot.store.SealWritten``)."""

    @property
    def prev(self) -> tuple[int, str] | None: ...
    @property
    def held(self) -> bool: ...


class Sealer(Protocol):
    """The store's seal writer (``gpubot.store.Store.seal``)."""

    async def seal(
        self, reason: str, every_s: float, *, after: int | None = None
    ) -> WrittenSeal: ...


Hook = Callable[[], Awaitable[object]]


class SealService:
    """Writes the running bot's seals; every failure is logged, never raised."""

    def __init__(self, store: Sealer, every_s: float, *, after_forced: Sequence[Hook] = ()) -> None:
        self.store = store
        self.every_s = every_s
        self.after_forced = tuple(after_forced)  # run after a forced action's seal
        self.running = False  # the schedule has sealed (a clean stop is sealed too)
        self._lock = asyncio.Lock()  # one seal at a time: each names the one before

    async def periodic(self) -> None:
        """The schedule's job: the first seal of this run is the start seal."""
        await self._seal("periodic" if self.running else "start")
        self.running = True

    async def forced(self, action_id: int | None = None) -> None:
        """Seal after a forced action ended (whatever its outcome), then run the hooks."""
        await self._seal("forced", action_id)
        for hook in self.after_forced:
            try:
                await hook()
            except Exception:
                log.exception("after the forced action's seal")

    async def stop(self) -> None:
        if self.running:
            self.running = False
            await self._seal("stop")

    async def _seal(self, reason: str, after: int | None = None) -> None:
        async with self._lock:
            try:
                w = await self.store.seal(reason, self.every_s, after=after)
            except GpubotError as exc:
                log.error("the audit log's %s seal was not written: %s", reason, exc)
                return
            if not w.held and w.prev is not None:
                log.error(
                    "the audit log no longer holds record %d (%s…) that this gpubot wrote: "
                    "records were removed from it; the %s seal written now names that record",
                    w.prev[0],
                    w.prev[1][:16],
                    reason,
                )
