"""``services.offload``: pure work runs in its one worker thread, not on the loop's."""

from __future__ import annotations

import threading

import pytest

from gpubot.services.offload import off_loop


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
