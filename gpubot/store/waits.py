"""Every wait on the database has a deadline.

Store calls run in a bounded pool of their own, never the loop's default one, so a database that
stops answering cannot starve what else uses threads (DNS, stdin). A call with no answer within
``DEADLINE_S`` raises ``DatabaseUnreachable`` and the request is refused. Its thread may stay
blocked; the engine's TCP keepalives end that wait when the server is gone, so the bot recovers
without a restart. ``DEADLINE_S`` is longer than every inner bound, so those speak first.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gpubot.core import clock
from gpubot.core.clock import within
from gpubot.errors import DatabaseUnreachable
from gpubot.store.outage import OUTAGE

T = TypeVar("T")

DEADLINE_S = 20.0  # the longest any store call may keep a request waiting
WORKERS = 16  # the store's own threads (the default pool has cpu + 4: 6 on a small box)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gpubot-db")
        return _pool


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Run ``fn(*args)`` in the store's pool; ``DatabaseUnreachable`` after ``DEADLINE_S``."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    try:
        return await within(loop.run_in_executor(pool(), call), DEADLINE_S)
    except TimeoutError:
        why = (
            f"the audit database is not answering (no reply in {DEADLINE_S:g} s): nothing was done"
        )
        OUTAGE.failed(why)  # a server gone without a word is an outage too (store.outage)
        raise DatabaseUnreachable(why) from None


HAND_OVER_S = 0.005  # the longest a store thread runs statements before it lets the loop in
STATEMENTS = clock.HandOver(HAND_OVER_S)  # around each statement, on every engine (store.engine)
