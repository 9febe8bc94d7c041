"""The event-loop watch of ``gpubot serve``: its gauge exists, and moves when the loop is held."""

from __future__ import annotations

import asyncio
import contextlib
import time

from benchmarks.slack_ack import parse_stalls
from gpubot.metrics import Metrics


async def test_a_held_loop_shows_in_the_stall_gauge() -> None:
    metrics = Metrics()
    before, late_before = parse_stalls(metrics.text())
    assert before == 0.0 and late_before == 0  # exported from the start
    watch = asyncio.create_task(metrics.watch_loop(every_s=0.01))
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # hold the loop, as a long parse or render would
        await asyncio.sleep(0.05)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    worst, late = parse_stalls(metrics.text())
    # The watch's timer was due at most 10 ms after the loop was taken: it woke >= 190 ms late.
    assert worst is not None and worst >= 0.15
    assert late is not None and late >= 1
    assert worst == metrics.max_stall_s


def test_the_gauge_keeps_the_longest_stall() -> None:
    metrics = Metrics()
    for s in (0.01, 0.3, 0.02):
        metrics.observe_stall(s)
    worst, late = parse_stalls(metrics.text())
    assert worst == 0.3 and late == 1
