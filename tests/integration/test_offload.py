"""``services.offload``: pure work runs in its one worker thread, not on the loop's, and lets
the loop in after each millisecond of jobs back to back (``offload.JOBS``; its effect is
measured by ``benchmarks/status_floor.py --stalls``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpubot.core import clock
from gpubot.services.offload import off_loop, release


async def test_the_work_runs_in_the_worker_and_its_answer_comes_back() -> None:
    loop_thread = threading.current_thread().name

    def work(x: int, *, y: int) -> tuple[str, int]:
        return threading.current_thread().name, x + y

    name, total = await off_loop(work, 2, y=3)
    assert total == 5 and name.startswith("gpubot-cpu") and name != loop_thread


async def test_an_error_in_the_work_is_raised_to_the_caller() -> None:
    def boom() -> None:
        raise ValueError("bad snapshot")

    with pytest.raises(ValueError, match="bad snapshot"):
        await off_loop(boom)


class Freed:
    """Says in which thread it was freed."""

    def __init__(self, where: list[str]) -> None:
        self.where = where

    def __del__(self) -> None:
        self.where.append(threading.current_thread().name)


async def test_release_frees_what_a_sweep_replaced_in_the_worker_not_on_the_loop() -> None:
    where: list[str] = []
    items: list[object] = [Freed(where) for _ in range(3)]
    await off_loop(release, items)
    assert items == [] and len(where) == 3
    assert all(w.startswith("gpubot-cpu") for w in where), where
    control: list[object] = [Freed(where)]  # the control: dropped here, freed on this thread
    control.clear()
    assert where[-1] == threading.current_thread().name


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads in which the loop was let in (recorded, not slept)."""
    seen: list[str] = []
    monkeypatch.setattr(clock, "let_loop_in", lambda: seen.append(threading.current_thread().name))
    return seen


async def test_jobs_back_to_back_let_the_loop_in_each_millisecond(pauses: list[str]) -> None:
    await asyncio.gather(*(off_loop(busy, 0.0004) for _ in range(20)))  # 8 ms of queued jobs
    assert 3 <= len(pauses) < 20, len(pauses)  # about one each 1 ms, never before the first
    assert all(p.startswith("gpubot-cpu") for p in pauses), pauses


async def test_control_jobs_with_gaps_between_them_never_pause(pauses: list[str]) -> None:
    for _ in range(10):
        await off_loop(busy, 0.0004)
        await asyncio.sleep(0.003)  # the worker waited for work: it held no lock
    assert pauses == []


async def test_release_lets_the_loop_in_while_it_frees(pauses: list[str]) -> None:
    class Slow:
        def __del__(self) -> None:
            busy(0.0002)

    items: list[object] = [Slow() for _ in range(40)]  # 8 ms of freeing
    await off_loop(release, items)
    assert items == [] and 3 <= len(pauses) < 41, len(pauses)  # the job's and about one a ms
