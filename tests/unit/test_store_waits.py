"""Store calls: their own threads, and a deadline (``gpubot.store.waits``)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from gpubot.errors import StoreError
from gpubot.store import waits


@pytest.mark.skip_idle  # the deadline and the wait pass on loop time
async def test_a_call_with_no_answer_is_refused_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waits, "DEADLINE_S", 0.3)
    gate = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match=r"not answering \(no reply in 0.3 s\)"):
            await waits.in_thread(gate.wait, 30)
    finally:
        gate.set()  # the blocked thread ends once the database answers
    assert time.monotonic() - started < 10


@pytest.mark.skip_idle  # the deadline and the wait pass on loop time
async def test_control_without_the_deadline_the_call_waits_until_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waits, "DEADLINE_S", None)
    gate = threading.Event()
    call = asyncio.ensure_future(waits.in_thread(gate.wait, 30))
    await asyncio.sleep(1.0)
    assert not call.done()  # still waiting, long after the 0.3 s above
    gate.set()
    assert await call is True


async def test_store_calls_run_when_the_default_pool_is_full() -> None:
    gate = threading.Event()
    loop = asyncio.get_running_loop()
    blocked = [loop.run_in_executor(None, gate.wait, 30) for _ in range(64)]
    try:
        name = await asyncio.wait_for(waits.in_thread(lambda: threading.current_thread().name), 10)
        assert name.startswith("gpubot-db")
    finally:
        gate.set()
        await asyncio.gather(*blocked)


@pytest.mark.skip_idle  # the threads are blocked for good: the timeout passes on loop time
async def test_control_in_the_default_pool_a_store_call_queues_behind_blocked_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waits, "pool", lambda: None)  # the defence removed: the loop's pool
    gate = threading.Event()
    loop = asyncio.get_running_loop()
    blocked = [loop.run_in_executor(None, gate.wait, 30) for _ in range(64)]
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(waits.in_thread(lambda: None), 1.0)
    finally:
        gate.set()
        await asyncio.gather(*blocked)


async def _cancelled_as_it_fails() -> BaseException:
    """Run a store call that fails, with the caller's cancellation arriving in the same turn
    of the loop as the call's end (as a shutdown meets a call to a stopped database); return
    what the caller got."""
    loop = asyncio.get_running_loop()
    caller: asyncio.Task[None] | None = None

    def failing() -> None:
        assert caller is not None
        loop.call_soon_threadsafe(caller.cancel)  # queued just before the call's own end
        raise StoreError("connection refused")

    caller = asyncio.ensure_future(waits.in_thread(failing))
    try:
        await caller
    except BaseException as exc:  # what came out is the point
        return exc
    raise AssertionError("the call returned")


async def test_a_cancellation_that_meets_the_end_of_a_call_is_kept() -> None:
    assert isinstance(await _cancelled_as_it_fails(), asyncio.CancelledError)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps it from Python 3.12 on")
async def test_control_with_wait_for_the_cancellation_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defence removed (``asyncio.wait_for``, CPython gh-86296): the call's error comes
    out instead, so a loop that handles it goes on after it was cancelled.

    The loss needs the call's end to reach the loop before the caller's next step; on a loaded
    box the worker thread may be descheduled between queuing the cancellation and ending, and
    then the cancellation wins. So the control asks whether it can be lost at all: some of a
    few tries lose it (on a quiet box the first)."""
    monkeypatch.setattr(waits, "within", asyncio.wait_for)
    got = [await _cancelled_as_it_fails() for _ in range(20)]
    assert any(isinstance(x, StoreError) for x in got)
