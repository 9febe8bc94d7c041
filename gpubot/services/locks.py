"""In-process named leases: the ``Locks`` of a gpubot without a database.

Light on purpose: the cold ``gpubot status`` builds them without the reset engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.lease import Lease
from gpubot.core.ports import Clock
from gpubot.core.timefmt import iso
from gpubot.errors import LockHeld


class NodeLocks:
    """In-process named leases: never lost, no fence, since nothing outside could check them."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._held: dict[str, tuple[str, float]] = {}
        self._clock = clock
        self._tokens = 0

    @asynccontextmanager
    async def hold(self, name: str, *, holder: str = "") -> AsyncIterator[Lease]:
        """Hold ``name`` or raise ``LockHeld`` naming who holds it and since when."""
        if name in self._held:
            who, since = self._held[name]
            raise LockHeld(name, f"{who} since {iso(since)}")
        self._held[name] = (holder, self._clock.now())
        self._tokens += 1
        try:
            yield Lease(name, holder, self._tokens, float("inf"), shared=False)
        finally:
            del self._held[name]
