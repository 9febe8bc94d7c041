"""Pure work off the event loop: one worker thread for what would hold the loop too long.

A large sweep's parsing and findings, run on the loop, stalled it and a Slack ack waited behind
it. In this thread the loop runs at every switch of the interpreter lock, and after each run of
jobs back to back (``JOBS``). One thread only: the work needs the lock anyway, and more threads
would make the loop wait behind each. Only pure functions go here.
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

JOBS = clock.HandOver(0.001)  # around each job
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpubot-cpu")
        return _pool


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool(), functools.partial(_job, fn, args, kwargs))


def _job(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """Run one job, letting the loop in first after a run of jobs: queued back to back, they
    kept the lock from the loop a switch interval after each of its socket calls."""
    JOBS.before()
    try:
        return fn(*args, **kwargs)
    finally:
        JOBS.after()


def release(items: list[Any]) -> None:
    """Drop ``items`` one at a time, in the worker: freeing a sweep's snapshots at once held the
    loop; here it takes the interpreter lock back between them."""
    while items:
        JOBS.before()
        items.pop()
        JOBS.after()
