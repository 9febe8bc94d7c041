"""Every wait on the database has a deadline (issue 22).

Store calls run in threads of their own pool (``gpubot-db``, bounded), never the event loop's
default one, so a database that stops answering cannot starve what else uses threads (DNS for
the Slack Web API, stdin ...). A call that gets no answer within ``DEADLINE_S`` raises
``DatabaseUnreachable("the audit database is not answering ...")`` (an outage, said once by
``store.outage``): the request is answered ("... so nothing was done") and refused. Its thread
may still be blocked on the connection; the TCP keepalives and ``tcp_user_timeout`` the engine
sets end that wait when the server is gone, and a server that answers again lets it finish by
itself. So the bot recovers without a restart.

``DEADLINE_S`` is longer than every wait inside a call that has its own bound (PostgreSQL's
connect timeout, SQLite's busy timeout, the pool's checkout timeout), so those still speak
first when they apply.
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
    """Return the store's thread pool (made on first use, one per process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gpubot-db")
        return _pool


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Run ``fn(*args)`` in the store's pool; raise ``DatabaseUnreachable`` after
    ``DEADLINE_S``."""
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
