"""Progress edits: at most one per interval per message, the latest state always, the end at once.

``chat.update`` is a Tier 3 method (https://api.slack.com/methods/chat.update), about 50 calls a
minute per app per workspace (https://api.slack.com/docs/rate-limits): gpubot spaces the progress
edits of one message by ``surface.MIN_UPDATE_S`` (2.5 s) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from typing import Any, cast

from gpubot.chat import surface
from gpubot.chat.blocks import Message, message_text, render_text
from gpubot.chat.flows import Flows, Services
from gpubot.chat.surface import Handle, Progress
from gpubot.core.models import ResetStep
from gpubot.errors import GpubotError
from gpubot.services.reset import ResetEvent
from gpubot.slack.app import GpuBot
from gpubot.slack.serve import build_bot

INTERVAL = 0.3


class Recorder:
    """A Surface that records when each write of a message began, and what it said."""

    def __init__(self) -> None:
        self.updates: list[tuple[float, Handle | None, Message]] = []
        self.posts: list[Message] = []
        self.replies: list[Message] = []

    async def reply(self, msg: Message) -> None:
        self.replies.append(msg)

    async def post(self, msg: Message, *, channel: str | None = None) -> Handle | None:
        self.posts.append(msg)
        return ("C1", f"{len(self.posts)}.0")

    async def update(self, handle: Handle | None, msg: Message) -> Handle | None:
        self.updates.append((time.monotonic(), handle, msg))
        await asyncio.sleep(0.01)  # a call takes a moment
        return handle


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_the_default_spacing_is_2_5_seconds_everywhere_slack_builds_flows() -> None:
    assert surface.MIN_UPDATE_S == 2.5
    for fn in (Flows.__init__, GpuBot.__init__, build_bot):
        assert inspect.signature(fn).parameters["min_update_s"].default == 2.5, fn


async def test_a_burst_of_progress_is_spaced_and_its_last_state_delivered() -> None:
    out = Recorder()
    state = {"n": 0}
    started = time.monotonic()
    progress = Progress(out, ("C1", "1.0"), lambda: render_text(f"step {state['n']}"), INTERVAL)
    for n in range(1, 61):  # 60 events over ~1.2 s: 4 intervals' worth
        state["n"] = n
        progress.poke()
        await asyncio.sleep(0.02)
    await asyncio.sleep(INTERVAL * 2)  # nothing new: the pending state still goes out
    await progress.stop()
    times = [t for t, _, _ in out.updates]
    assert times, "no progress edit at all"
    assert times[0] - started >= INTERVAL  # the message was just written: the first edit waits
    assert min(gaps(times), default=INTERVAL) >= INTERVAL
    assert len(times) <= (times[-1] - started) / INTERVAL + 1
    assert len(times) < 60 / 4  # coalesced, not one edit per event
    assert message_text(out.updates[-1][2]) == "step 60"  # the latest state was delivered
    assert {h for _, h, _ in out.updates} == {("C1", "1.0")}


async def test_stop_ends_without_waiting_for_the_interval() -> None:
    out = Recorder()
    progress = Progress(out, ("C1", "1.0"), lambda: render_text("x"), 30.0)
    progress.poke()
    started = time.monotonic()
    assert await progress.stop() == ("C1", "1.0")
    assert time.monotonic() - started < 1.0 and out.updates == []


async def test_the_final_answer_goes_out_at_once_after_a_burst() -> None:
    out = Recorder()
    flow = Flows(cast(Services, None), source="slack", min_update_s=30.0)
    done_at: dict[str, float] = {}

    async def start(sink: Any) -> Any:
        for i in range(20):
            await sink(
                ResetEvent(ResetStep.SIGNAL, time.time(), {"signal": "SIGTERM", "result": "sent"})
            )
            await asyncio.sleep(0.01 * (i % 2))
        done_at["t"] = time.monotonic()
        raise GpubotError("node1 stopped answering")

    where, result = await flow._execute(out, ("C1", "1.0"), "Reset node1", "by x", None, start)
    assert result is None and where == ("C1", "1.0")
    (final,) = out.updates  # no progress edit within 30 s; the end is not held back
    assert final[0] - done_at["t"] < 1.0
    assert "node1 stopped answering" in message_text(final[2])


async def test_the_final_answer_follows_a_pending_edit_in_order() -> None:
    out = Recorder()
    flow = Flows(cast(Services, None), source="slack", min_update_s=INTERVAL)

    async def start(sink: Any) -> Any:
        for _ in range(30):
            await sink(ResetEvent(ResetStep.EXITED, time.time(), {}))
            await asyncio.sleep(0.03)
        raise GpubotError("gave up")

    await flow._execute(out, ("C1", "1.0"), "Reset node1", "by x", None, start)
    times = [t for t, _, _ in out.updates]
    assert min(gaps(times[:-1]), default=INTERVAL) >= INTERVAL  # progress edits spaced
    assert "gave up" in message_text(out.updates[-1][2])  # the end is last
    assert all("gave up" not in message_text(m) for _, _, m in out.updates[:-1])
