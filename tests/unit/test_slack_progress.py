"""Progress edits: at most one per interval per message, the latest state always, the end at once.

``chat.update`` is a Tier 3 method (https://api.slack.com/methods/chat.update), about 50 calls a
minute per app per workspace (https://api.slack.com/docs/rate-limits): gpubot spaces the progress
edits of one message by ``surface.MIN_UPDATE_S`` (2.5 s) unless told otherwise.

Progress reads time only through its ``Clock``: these tests run on a virtual clock, so the gaps
they check are exact, and no test waits on wall time.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Coroutine
from typing import Any

from gpubot.chat import surface
from gpubot.chat.flows import Flows
from gpubot.chat.message import Message, note
from gpubot.chat.surface import MessageRef, Progress
from gpubot.chat.tracking import Pace, Tracker
from gpubot.console.text_render import render_text
from gpubot.core.models import ResetStep
from gpubot.errors import GpubotError
from gpubot.services.requests import Failed, Outcome, Running
from gpubot.services.reset import ResetEvent, ResetResult
from gpubot.slack.front import SlackFront
from tests.fixtures.clock import VirtualClock

INTERVAL = 0.3


class Recorder:
    """A Surface that records when each write of a message began, and what it said."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.updates: list[tuple[float, MessageRef | None, Message]] = []
        self.posts: list[Message] = []
        self.replies: list[Message] = []

    async def reply(self, msg: Message) -> None:
        self.replies.append(msg)

    async def post(self, msg: Message, *, channel: str | None = None) -> MessageRef | None:
        self.posts.append(msg)
        return MessageRef(f"C1/{len(self.posts)}.0")

    async def update(self, handle: MessageRef | None, msg: Message) -> MessageRef | None:
        self.updates.append((self.clock.monotonic(), handle, msg))
        await self.clock.sleep(0.01)  # a call takes a moment
        return handle


async def ended(track: Tracker, request: Coroutine[Any, Any, Outcome]) -> ResetResult | None:
    """Run ``request``, then write its outcome (as a flow does)."""
    return await track.end(await request)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_the_default_spacing_is_2_5_seconds_everywhere_slack_builds_flows() -> None:
    assert surface.MIN_UPDATE_S == 2.5
    for fn in (Flows.__init__, SlackFront.__init__):
        assert inspect.signature(fn).parameters["min_update_s"].default == 2.5, fn


async def test_a_burst_of_progress_is_spaced_and_its_last_state_delivered() -> None:
    clock = VirtualClock()
    out = Recorder(clock)
    state = {"n": 0}
    started = clock.monotonic()
    render = lambda: note(f"step {state['n']}")  # noqa: E731
    progress = Progress(out, MessageRef("C1/1.0"), render, INTERVAL, clock)
    for n in range(1, 61):  # 60 events over 1.2 s: 4 intervals' worth
        state["n"] = n
        progress.poke()
        await clock.advance(0.02)
    await clock.advance(INTERVAL * 2)  # nothing new: the pending state still goes out
    await progress.stop()
    times = [t for t, _, _ in out.updates]
    assert times, "no progress edit at all"
    assert times[0] - started >= INTERVAL  # the message was just written: the first edit waits
    assert min(gaps(times), default=INTERVAL) >= INTERVAL
    assert len(times) <= (times[-1] - started) / INTERVAL + 1
    assert len(times) < 60 / 4  # coalesced, not one edit per event
    assert render_text(out.updates[-1][2]) == "step 60"  # the latest state was delivered
    assert {h for _, h, _ in out.updates} == {MessageRef("C1/1.0")}


async def test_stop_ends_without_waiting_for_the_interval() -> None:
    clock = VirtualClock()
    out = Recorder(clock)
    progress = Progress(out, MessageRef("C1/1.0"), lambda: note("x"), 30.0, clock)
    progress.poke()
    await clock.advance(1.0)
    assert await progress.stop() == MessageRef("C1/1.0")  # no clock moves: it did not wait
    assert clock.monotonic() == 1.0 and out.updates == []


async def test_the_final_answer_goes_out_at_once_after_a_burst() -> None:
    clock = VirtualClock()
    out = Recorder(clock)
    track = Tracker(
        out, Pace(30.0, clock), asked=("by x",), handle=MessageRef("C1/1.0"), title="Reset"
    )
    done_at: dict[str, float] = {}

    async def start() -> Outcome:
        await track(Running(None))
        for i in range(20):
            await track(
                ResetEvent(ResetStep.SIGNAL, clock.now(), {"signal": "SIGTERM", "result": "sent"})
            )
            await clock.sleep(0.01 * (i % 2))
        done_at["t"] = clock.monotonic()
        return Failed(GpubotError("node1 stopped answering"))

    run = asyncio.ensure_future(ended(track, start()))
    while not run.done():
        await clock.advance(0.01)
    result = await run
    assert result is None and track.handle == "C1/1.0"
    (final,) = out.updates  # no progress edit within 30 s; the end is not held back
    assert final[0] == done_at["t"]  # at once: no moment of the clock passed in between
    assert "node1 stopped answering" in render_text(final[2])


async def test_the_final_answer_follows_a_pending_edit_in_order() -> None:
    clock = VirtualClock()
    out = Recorder(clock)
    track = Tracker(out, Pace(INTERVAL, clock), asked=("by x",), handle=MessageRef("C1/1.0"))

    async def start() -> Outcome:
        await track(Running(None))
        for _ in range(30):
            await track(ResetEvent(ResetStep.EXITED, clock.now(), {}))
            await clock.sleep(0.03)
        return Failed(GpubotError("gave up"))

    run = asyncio.ensure_future(ended(track, start()))
    while not run.done():
        await clock.advance(0.01)
    await run
    times = [t for t, _, _ in out.updates]
    assert len(times) >= 3  # progress edits were made (0.9 s of events, 0.3 s apart)
    assert min(gaps(times[:-1]), default=INTERVAL) >= INTERVAL - 1e-9  # progress edits spaced
    assert "gave up" in render_text(out.updates[-1][2])  # the end is last
    assert all("gave up" not in render_text(m) for _, _, m in out.updates[:-1])
