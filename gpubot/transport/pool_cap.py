"""The SSH pool's cap: at most so many connections open, so the descriptor limit is never hit.

Past the descriptor limit the last nodes would fail with ``EMFILE`` and look unreachable. A
command holds its node's place; when the pool is full, a new node takes the place of the least
recently used idle one (closed); when every place is busy it waits at most ``wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from gpubot.core.clock import within
from gpubot.errors import NodeUnreachable

log = logging.getLogger("gpubot.transport")


class ConnectionCap:
    """Places for at most ``limit`` connections, least recently used first to give way."""

    def __init__(self, limit: int, close: Callable[[str], None]) -> None:
        self.limit = max(1, limit)
        self._close = close  # closes a node's pooled connection, if it has one
        self._places: OrderedDict[str, int] = OrderedDict()  # node -> commands running
        self._freed: asyncio.Event | None = None
        self.closed_for_room = 0

    @contextlib.asynccontextmanager
    async def held(self, node: str, wait_s: float) -> AsyncIterator[None]:
        """Hold ``node``'s place while a command runs on it."""
        await self._take(node, wait_s)
        try:
            yield
        finally:
            self._places[node] -= 1
            if self._places[node] == 0 and self._freed is not None:
                self._freed.set()

    async def _take(self, node: str, wait_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while node not in self._places and len(self._places) >= self.limit:
            idle = next((n for n, busy in self._places.items() if busy == 0), None)
            if idle is not None:
                del self._places[idle]
                self._close(idle)
                self.closed_for_room += 1
                if self.closed_for_room == 1:
                    log.warning(
                        "SSH connections at their cap of %d (the descriptor limit): idle ones are "
                        "closed to reach more nodes; raise LimitNOFILE to keep one per node",
                        self.limit,
                    )
                continue
            self._freed = self._freed or asyncio.Event()
            self._freed.clear()
            try:
                await within(self._freed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise NodeUnreachable(
                    node,
                    f"no SSH connection free: all {self.limit} that the descriptor limit allows "
                    f"are busy for {wait_s:g}s",
                ) from None
        self._places[node] = self._places.get(node, 0) + 1
        self._places.move_to_end(node)
