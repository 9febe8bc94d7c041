"""Pure work off the event loop: one worker thread for what would hold the loop too long.

A sweep of 2,000 nodes parses 2,000 probe answers (about 1.5 ms each), builds 16,000 samples
and looks for findings in every snapshot. Run on the loop, answers that arrive together are
parsed in one turn of the loop and the findings in one step: the loop stalled for hundreds of
milliseconds, and a Slack ack waited behind it. In this thread the same work lets the loop run
at every switch of the interpreter lock (``sys.getswitchinterval()``, 5 ms), and after each
millisecond of jobs back to back (``JOBS``, a ``clock.HandOver``). One thread only:
the work needs the lock anyway, and more threads would make the loop wait behind each of them.
Only pure functions go here (no I/O, nothing that touches the loop).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gpubot.core import clock

T = TypeVar("T")

JOBS = clock.HandOver(0.001)  # around each job: lets the loop in after 1 ms of them
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """Return the worker (made on first use, one per process)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpubot-cpu")
        return _pool


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Return ``fn(*args, **kwargs)``, computed in the worker thread (``_job``)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool(), functools.partial(_job, fn, args, kwargs))


def _job(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """Run one job, letting the loop in first after 1 ms of jobs back to back (``JOBS``). Jobs
    queued one after another (a sweep's 2,000 parses) kept the lock from the loop for up to
    5 ms after each of its socket calls: 53-71 ms stalls in sweeps over SSH at 2,000 nodes
    (``benchmarks/status_floor.py --stalls``, issue 24)."""
    JOBS.before()
    try:
        return fn(*args, **kwargs)
    finally:
        JOBS.after()


def release(items: list[Any]) -> None:
    """Drop ``items`` one at a time (in the worker: ``off_loop(release, items)``).

    Freeing the 2,000 snapshots a sweep replaces is 38,000 objects: done in one statement on the
    loop it held the loop 17-27 ms on the shared box (issue 24). One at a time, in this thread,
    the loop takes the interpreter lock back between them.
    """
    while items:
        JOBS.before()
        items.pop()
        JOBS.after()
