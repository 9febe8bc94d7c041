"""Where the event loop is when it stalls: a watchdog thread that samples the loop's stack.

::

    python -m benchmarks.stall_locate --nodes 500 --sweeps 3     # quick
    python -m benchmarks.stall_locate --nodes 2000 --sweeps 4    # a large fleet

A 5 ms timer on the loop stamps each tick. A watchdog thread looks every ``every_s`` (2 ms): once
the loop has not ticked for more than ``threshold_s`` (30 ms) it takes the loop thread's stack
(``sys._current_frames()``) and counts its frames, until the loop ticks again. The report is the
frames seen most often in stalls: the innermost frame of each sample ("self"), the innermost
frame in gpubot's own code, and every frame on the stack ("total"). A sample whose innermost
frame is the loop's own ``select`` or ``_run_once`` means the loop was ready but waiting for the
interpreter lock (another thread held it). The sampler needs the lock too, so it samples at the
interpreter's switches (5 ms): a stall spent in one C call (a collection) shows as the frame
that started it, sampled once at the end.

The bot is ``sweep_heap``'s ``heap`` arm (``serve``'s collector set-up) over the recorded probe
answers of ``benchmarks.scale_store``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import pstats
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

ROOT = "gpubot/"
IDLE = ("selectors.py", "asyncio/selector_events.py:119(_read_from_self)")


def where(frame: FrameType) -> str:
    """Return ``path:line(function)`` of ``frame``, the path from the package root."""
    path = frame.f_code.co_filename
    for mark in ("/gpubot/", "/gpusim/", "/benchmarks/", "/asyncio/", "/sqlalchemy/"):
        if mark in path:
            path = mark[1:] + path.split(mark, 1)[1]
            break
    else:
        path = path.rsplit("/", 1)[-1]
    return f"{path}:{frame.f_lineno}({frame.f_code.co_name})"


class StallLocator:
    """Samples the loop thread's stack while the loop has not ticked for ``threshold_s``."""

    def __init__(self, threshold_s: float = 0.03, every_s: float = 0.002) -> None:
        self.threshold_s = threshold_s
        self.every_s = every_s
        self.main = threading.get_ident()  # made on the loop's thread
        self.last = time.perf_counter()
        self.self_: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()
        self.total: collections.Counter[str] = collections.Counter()
        self.others: collections.Counter[str] = collections.Counter()  # other threads, innermost
        self.stacks: collections.Counter[str] = collections.Counter()  # loop thread, busy
        self.stalls: list[tuple[float, int]] = []  # (length s, samples) of each stall
        self._stop = threading.Event()
        self._in_stall = False
        self._samples = 0
        self._gap = 0.0

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.last = time.perf_counter()
        if not self._stop.is_set():
            loop.call_later(0.005, self._tick, loop)

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            gap = time.perf_counter() - self.last
            if gap <= self.threshold_s:
                if self._in_stall:
                    self.stalls.append((self._gap, self._samples))
                self._in_stall, self._samples = False, 0
                continue
            frames = sys._current_frames()
            frame = frames.get(self.main)
            if time.perf_counter() - self.last <= self.threshold_s or frame is None:
                continue  # the loop ticked while we waited for the lock
            self._in_stall, self._gap = True, gap
            self._samples += 1
            self.sample(frame)
            self.sample_others(frames)

    def sample_others(self, frames: dict[int, FrameType]) -> None:
        """Count the innermost frame of every other thread (named), where the lock may be."""
        names = {t.ident: t.name for t in threading.enumerate()}
        me = threading.get_ident()
        for ident, frame in frames.items():
            if ident not in (self.main, me):
                self.others[f"[{names.get(ident, ident)}] {where(frame)}"] += 1

    def sample(self, frame: FrameType | None) -> None:
        """Count one sample of the stack whose innermost frame is ``frame``."""
        first, mine, seen, chain = True, True, set(), []
        while frame is not None:
            at = where(frame)
            if at.startswith(("gpubot/", "benchmarks/", "asyncio/", "sqlalchemy/")) or first:
                chain.append(at)
            if first:
                self.self_[at] += 1
                first = False
            if mine and at.startswith(ROOT):
                self.own[at] += 1
                mine = False
            if at not in seen:
                self.total[at] += 1
                seen.add(at)
            frame = frame.f_back
        if chain and not chain[0].startswith(IDLE):
            self.stacks[" < ".join(chain[:8])] += 1

    @contextmanager
    def running(self) -> Iterator[None]:
        """Watch the running loop while the block runs."""
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self.last = time.perf_counter()
        loop.call_soon(self._tick, loop)
        t = threading.Thread(target=self._watch, name="stall-locator", daemon=True)
        t.start()
        try:
            yield
        finally:
            self._stop.set()
            t.join()

    def report(self, top: int = 15) -> list[str]:
        """Return the stalls and the most-sampled frames, as text lines."""
        n = sum(self.self_.values())
        lengths = sorted((round(g * 1000) for g, _ in self.stalls), reverse=True)
        lines = [
            f"stalls > {self.threshold_s * 1000:.0f} ms: {len(self.stalls)}, longest "
            f"(ms, as last seen): {lengths[:10]}; samples: {n}"
        ]
        for title, counter in (
            ("self", self.self_),
            ("gpubot", self.own),
            ("total", self.total),
            ("other threads' innermost", self.others),
            ("loop thread busy: stacks", self.stacks),
        ):
            lines.append(f"-- top {title} frames (samples) --")
            lines += [f"{c:5d} {at}" for at, c in counter.most_common(top)]
        return lines


class SlowSteps:
    """Times every callback the loop runs (its thread's CPU): the steps over ``over_s``, with
    where the task's coroutine stopped after the step (the await that ended it)."""

    def __init__(self, over_s: float = 0.010, *, profile: bool = False) -> None:
        self.over_s = over_s
        self.profile = profile  # each step under cProfile (thread CPU): slow, but says where
        self.steps: list[tuple[float, float, str]] = []  # (cpu s, wall s, what)
        self.profiles: list[tuple[float, Any]] = []

    @contextmanager
    def running(self) -> Iterator[None]:
        """Wrap ``asyncio.Handle._run`` while the block runs."""
        handle = asyncio.events.Handle
        plain = handle._run
        me = self

        def timed(h: asyncio.Handle) -> None:
            prof = cProfile.Profile(time.thread_time) if me.profile else None
            c0, w0 = time.thread_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            plain(h)
            if prof is not None:
                prof.disable()
            cpu = time.thread_time() - c0
            if cpu > me.over_s:
                me.steps.append((cpu, time.perf_counter() - w0, me.what(h)))
                if prof is not None:
                    me.profiles.append((cpu, prof))

        handle._run = timed  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            handle._run = plain  # type: ignore[method-assign]

    @staticmethod
    def what(h: asyncio.Handle) -> str:
        """Return the callback, and for a task the frames its coroutine is suspended in."""
        cb = getattr(h, "_callback", None)
        task = getattr(cb, "__self__", None)
        if isinstance(task, asyncio.Task):
            coro: Any = task.get_coro()
            frames = []
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is None:
                    break
                frames.append(where(frame))
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            return " > ".join(frames) or repr(task)
        return repr(cb)[:200]

    def report(self, top: int = 12) -> list[str]:
        lines = [f"-- loop steps over {self.over_s * 1000:.0f} ms of CPU: {len(self.steps)} --"]
        for cpu, wall, what in sorted(self.steps, reverse=True)[:top]:
            lines.append(f"cpu {cpu * 1000:5.1f} ms wall {wall * 1000:5.1f} ms  {what}")
        for cpu, prof in sorted(self.profiles, key=lambda p: -p[0])[:2]:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
            lines += [f"-- profile of a step of {cpu * 1000:.1f} ms (profiled) --", out.getvalue()]
        return lines


async def sweeps(
    nodes: int, count: int, *, threshold_s: float = 0.03, profile: bool = False, first: bool = False
) -> list[str]:
    """Sweep ``count`` times over ``nodes`` recorded nodes under the locator; return its report.
    The bot's first sweep (which writes every GPU's first rows) is watched too with ``first``."""
    import tempfile
    from pathlib import Path

    from benchmarks.scale_store import Watch, ms, recorded_app
    from gpubot.lifecycle import SweepHeap, settle_heap

    with tempfile.TemporaryDirectory(prefix="gpubot-stall-") as tmp:
        work = Path(tmp)
        app, _ = recorded_app(work, nodes)
        settle_heap()
        heap = SweepHeap()
        app.sweep.heap = heap.around
        loc, watch, steps = StallLocator(threshold_s), Watch(), SlowSteps(profile=profile)
        lines: list[str] = []
        try:
            if not first:
                await app.sweep.run(alerting=True)  # the first: connects, warms caches
            with loc.running(), steps.running():
                for i in range(count):
                    with watch.running():
                        await app.sweep.run(alerting=True)
                        await asyncio.sleep(0.2)
                    late, own, cpu = watch.worst()
                    lines.append(
                        f"sweep {i + 1}: worst late {ms(late)} ms, less CPU wait "
                        f"{ms(own)} ms, loop CPU in one tick {ms(cpu)} ms, settle "
                        f"{heap.settle_s * 1000:.1f} ms"
                    )
        finally:
            await app.close()
    return lines + loc.report() + steps.report()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stall_locate")
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--sweeps", type=int, default=3)
    p.add_argument("--threshold-ms", type=float, default=30.0, help="a stall is longer")
    p.add_argument("--profile", action="store_true", help="profile the long loop steps")
    p.add_argument("--first", action="store_true", help="watch the bot's first sweep too")
    a = p.parse_args(argv)
    threshold_s = a.threshold_ms / 1000
    run = sweeps(a.nodes, a.sweeps, threshold_s=threshold_s, profile=a.profile, first=a.first)
    out: list[str] = asyncio.run(run)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
