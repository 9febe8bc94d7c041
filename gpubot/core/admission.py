"""How many nodes a fleet round works on at once: all it may while the loop keeps up (issue 24).

``fan_out`` runs ``[ssh] max_parallel`` workers (64). Where each node's answer takes long to
come (a real network, a probe of 100-300 ms on the node), that many in flight is what keeps a
round short, and the loop is mostly idle. Where answers come back at once (a fleet on a fast
network, or answering from memory), the loop itself is the bottleneck: every turn of it runs
the steps of every connection whose answer arrived during the turn before, so one turn's work
grows with the number in flight, about 0.5 ms each: 30-40 ms in one turn at 64, and a Slack
ack, a timer or the loop-stall gauge waits behind it. More in flight then makes no round any
shorter, only the turns longer.

``Admission`` watches the loop's own CPU in each window of a 5 ms timer (the thread's CPU,
so a box busy with other processes does not count) and admits fewer nodes while a window holds
more than ``BUSY_S`` of it, an eighth more after each window under ``CALM_S`` (from 16 to 64 in
13 windows, some 70 ms: what a small round on a slow network waits), never fewer than
``FLOOR`` nor more than the limit. Waiting for a free place is waiting for a turn: it counts in
a round's budget as before.
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
        """Hold a place while the block runs, waiting for one first, in turn.

        A freed place is handed to the first waiter there and then (counted as its own), so
        that whoever frees one cannot take it straight back past those waiting."""
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
