"""``services.offload``: pure work runs in its one worker thread, not on the loop's."""

from __future__ import annotations

import threading

import pytest

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
