"""The system clock: the default ``Clock`` (``core.ports``) of every service."""

from __future__ import annotations

import asyncio
import time


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
