"""The system clock: the default ``Clock`` (``core.ports``) of every service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class SystemClock:
    """Wall time, monotonic time and sleeping, from the operating system."""

    def now(self) -> float:
        """Return unix time in seconds."""
        return time.time()

    def monotonic(self) -> float:
        """Return a monotonic time in seconds (for deadlines and durations)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (yielding to the event loop)."""
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """Await ``aw`` for at most ``seconds`` (None: no limit); raise ``TimeoutError`` after.

    Every bounded wait in gpubot goes through here rather than ``asyncio.wait_for``: on Python
    3.11, ``wait_for`` loses a cancellation that arrives just as ``aw`` finishes (CPython
    gh-86296, fixed in 3.12). It returns ``aw``'s result or raises its error instead, and a
    loop cancelled at shutdown then never ends."""
    async with asyncio.timeout(seconds):
        return await aw
