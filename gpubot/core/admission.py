"""How many nodes a fleet round works on at once: all it may while the loop keeps up.

Where answers are slow (a real network), ``[ssh] max_parallel`` in flight keeps a round short.
Where they come back at once, the loop is the bottleneck: each turn runs the steps of every
connection answered in the turn before, so more in flight makes no round shorter, only turns
longer, and a Slack ack or a timer waits behind them. ``Admission`` watches the loop thread's own
CPU (a box busy with other processes does not count) and admits fewer nodes after a busy window,
an eighth more after a calm one, between ``FLOOR`` and the limit. Waiting for a place counts in
a round's budget.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator

EVERY_S = 0.005  # the watch's timer
BUSY_S = 0.020  # the loop's CPU in one window of the watch: more, and fewer are admitted
CALM_S = 0.010  # less, and an eighth more are admitted (at least one)
GROW = 8
CUT = 0.8  # a busy window leaves this share of the places
FLOOR = 16  # never fewer in flight (a cold round's handshakes wait on the other end too)


class Admission:
    """Places for nodes in flight: ``limit`` of them while the loop keeps up, fewer while not."""

    def __init__(self, limit: int, *, floor: int | None = None) -> None:
        self.limit = max(1, limit)
        self.floor = max(1, min(FLOOR if floor is None else floor, self.limit))
        # How many may be in flight now: from the floor up, as the loop shows it keeps up (all
        # at once, a cold round's first handshakes would answer in the same turns).
        self.places = self.floor
        self.running = 0
        self.most = self.places  # the most places this round came to (for its log line)
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Hold a place while the block runs; a freed place goes to the first waiter at once,
        so whoever frees one cannot take it straight back past those waiting."""
        if self.running >= self.places:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await turn  # given: ``running`` counts it already
            except BaseException:
                if turn.done() and not turn.cancelled():  # given, then cancelled: pass it on
                    self.running -= 1
                    self._wake()
                raise
        else:
            self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._wake()

    def _wake(self) -> None:
        """Hand each free place to the first waiter still waiting."""
        while self.running < self.places and self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a waiter cancelled before its turn came is passed over
                turn.set_result(None)
                self.running += 1

    def saw(self, loop_cpu_s: float) -> None:
        """Take one window's loop CPU into account."""
        if loop_cpu_s > BUSY_S:
            self.places = max(self.floor, int(self.places * CUT))
        elif loop_cpu_s < CALM_S and self.places < self.limit:
            self.places = min(self.limit, self.places + max(1, self.places // GROW))
            self.most = max(self.most, self.places)
            self._wake()

    async def watch(self) -> None:
        """Measure the loop's CPU in each window of the timer, until cancelled."""
        if self.floor >= self.limit:
            return  # nothing to adjust
        while True:
            cpu = time.thread_time()
            await asyncio.sleep(EVERY_S)
            self.saw(time.thread_time() - cpu)
