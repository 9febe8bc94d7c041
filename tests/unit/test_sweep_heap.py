"""``SweepHeap`` (issue 24): no full collection while a sweep runs, its survivors frozen after,
and a valve that runs one full pass when frozen garbage cycles could pile up. Each defence has
its control: the same allocations outside ``around`` do set off full passes, and a frozen
garbage cycle stays alive until the valve is due. The collector is process-wide, so every test
puts back its thresholds and unfreezes what it froze."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.app import Serving, build
from gpubot.config import load
from gpubot.lifecycle import NO_FULL_PASS, SweepHeap


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()


class Node:
    """A garbage-collected object that can be part of a cycle and watched by a weakref."""

    def __init__(self) -> None:
        self.other: object = None


def full_passes(body: object) -> int:
    """Return how many full passes (generation 2) ran while ``body()`` ran."""
    seen: list[int] = []

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    gc.callbacks.append(cb)
    try:
        assert callable(body)
        body()
    finally:
        gc.callbacks.remove(cb)
    return len(seen)


def allocate(n: int = 60_000) -> list[list[int]]:
    """Make long-lived objects: enough to set off full passes under small thresholds."""
    return [[i] for i in range(n)]


def enough() -> int:
    """Return how many objects set off a full pass in this process: the collector runs one only
    once the objects new to the old generation exceed a quarter of those already there, so a
    test process that ran many tests before needs more."""
    return max(60_000, len(gc.get_objects()) // 2)


def test_no_full_pass_runs_inside_and_the_thresholds_come_back() -> None:
    gc.set_threshold(50, 2, 2)
    gc.collect()
    heap = SweepHeap()
    kept: list[object] = []
    n = enough()
    with heap.around():
        assert gc.get_threshold() == (50, 2, NO_FULL_PASS)
        inside = full_passes(lambda: kept.append(allocate(n)))
    assert gc.get_threshold() == (50, 2, 2)
    outside = full_passes(lambda: kept.append(allocate(enough())))
    assert (inside, outside > 0) == (0, True)  # the control: the same work outside does


def test_what_survived_a_sweep_is_frozen_out_of_later_passes() -> None:
    heap = SweepHeap()
    with heap.around():
        survivor = Node()
    assert heap.baseline is not None and heap.baseline > 0
    assert not any(o is survivor for o in gc.get_objects())  # no pass walks it again
    young = Node()  # the control: made after the freeze, still walked
    assert any(o is young for o in gc.get_objects())


async def test_overlapping_sweeps_lift_once_and_put_back_the_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    heap = SweepHeap()
    first_in, second_in, first_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first() -> None:
        with heap.around():
            first_in.set()
            await second_in.wait()
        first_out.set()

    async def second() -> None:
        await first_in.wait()
        with heap.around():
            second_in.set()
            await first_out.wait()
            assert gc.get_threshold()[2] == NO_FULL_PASS  # the other ended: still lifted

    await asyncio.gather(first(), second())
    assert gc.get_threshold() == (700, 10, 10)


def _frozen_cycle() -> weakref.ref[Node]:
    """Leave a garbage cycle in the old generation, where a young pass does not look."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect()  # both survive into the old generation ...
    ref = weakref.ref(a)
    del a, b  # ... and are garbage there
    return ref


def test_the_valve_frees_frozen_garbage_cycles_once_they_could_pile_up() -> None:
    heap = SweepHeap(slack=1.0, floor=10_000)
    with heap.around():
        pass
    ref = _frozen_cycle()
    with heap.around():  # not due: the cycle is frozen with the rest (the control)
        pass
    assert ref() is not None and heap.full_passes == 0
    kept = allocate()  # the blocks in use grow past the baseline + floor
    with heap.around():
        pass
    assert heap.full_passes == 1 and ref() is None
    assert heap.baseline is not None and len(kept) == 60_000


def test_settling_never_walks_the_frozen_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gc.get_freeze_count`` walks every frozen object with the lock held (40-50 ms of the
    loop after each 2,000-node sweep): the valve counts blocks in use instead."""
    walks: list[int] = []
    real = gc.get_freeze_count

    def counted() -> int:
        walks.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counted)
    heap = SweepHeap(slack=1.0, floor=10_000)
    for _ in range(2):
        with heap.around():
            pass
    kept = allocate()
    with heap.around():  # the valve too
        pass
    assert (walks, heap.full_passes, len(kept)) == ([], 1, 60_000)
    gc.get_freeze_count()  # the control: the patch sees a walk
    assert walks == [1]


async def test_serve_sets_the_heap_of_sweeps_and_status_rounds_a_test_build_does_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/gpubot.db"\n'  # never the checkout's own
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'
    )
    for settle, want in ((False, False), (True, True)):
        serving = Serving(sweeps=False, settle_heap=settle, first_after_s=3600)
        app = build(load(path), {}, need_store=False, serving=serving)
        try:
            async with app.running():
                assert (app.sweep.heap is not None) is want
                assert (app.status.heap is not None) is want  # status rounds too (issue 24)
                if want:  # one heap: overlapping sweeps and rounds share one lift
                    assert app.status.heap == app.sweep.heap
        finally:
            await app.close()


async def test_a_status_round_runs_with_no_full_pass(tmp_path: Path) -> None:
    # A round of 2,000 nodes set off full passes on the loop (95-218 ms, issue 24), as sweeps did.
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/gpubot.db"\n'  # never the checkout's own
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'  # refused
    )
    gc.set_threshold(700, 10, 10)
    seen: list[int] = []
    app = build(load(path), {}, need_store=False)
    plain = app.status.snapshot

    async def snapshot(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_threshold()[2])
        return await plain(*args, **kwargs)  # type: ignore[arg-type]

    app.status.snapshot = snapshot  # type: ignore[method-assign,assignment]
    try:
        await app.status.fleet(["all"])  # the control: no heap set, as in a command
        app.status.heap = SweepHeap().around
        res = await app.status.fleet(["all"])
    finally:
        await app.close()
    assert list(res.failed) == ["node3"]  # probed (and refused) inside the round
    assert seen == [10, NO_FULL_PASS]
    assert gc.get_threshold() == (700, 10, 10)  # put back after the round
