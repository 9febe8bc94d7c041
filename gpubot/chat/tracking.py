"""One request's events as messages: the ``RequestSink`` a flow hands ``services.requests``.
Progress edits are coalesced (``surface.Progress``), so the reset never waits on chat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpubot.chat.errors import error_message
from gpubot.chat.message import Message, Text, note
from gpubot.chat.reset_view import gpu_list, render_progress, render_result
from gpubot.chat.surface import MessageRef, Progress, Surface
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock
from gpubot.core.reset.plan import ResetPlan
from gpubot.errors import GpubotError
from gpubot.services.requests import (
    Decided,
    Done,
    Failed,
    Outcome,
    Planning,
    Refusal,
    RequestEvent,
    Running,
)
from gpubot.services.reset import ResetResult
from gpubot.services.reset_run import ResetEvent

Frame = Callable[[Message | None], Message]  # wraps a body in a request's own message


def plain(body: Message | None) -> Message:
    return body or note("")


def reset_title(plan: ResetPlan) -> str:
    return f"Reset {plan.node} · GPU {gpu_list(plan.gpus)}"


@dataclass
class Pace:
    """How progress edits are spaced, and the clock they are spaced by."""

    interval: float
    clock: Clock = SYSTEM_CLOCK


class Tracker:
    """The chat side of one request on one surface: where its message is, and what it shows."""

    def __init__(
        self,
        out: Surface,
        pace: Pace,
        *,
        asked: Text,
        planning: Message | None = None,
        handle: MessageRef | None = None,
        title: str | None = None,
        on_decided: Callable[[Tracker, Decided], Awaitable[None]] | None = None,
    ) -> None:
        self.out = out
        self.pace = pace
        self.asked = asked
        self.planning = planning
        self.handle = handle
        self.title = title
        self.on_decided = on_decided
        self.frame: Frame = plain
        self.plan: ResetPlan | None = None
        self.events: list[ResetEvent] = []
        self.progress: Progress | None = None

    async def __call__(self, event: RequestEvent) -> None:
        if isinstance(event, ResetEvent):
            self.events.append(event)
            if self.progress is not None:
                self.progress.poke()
        elif isinstance(event, Refusal):
            await self.out.reply(error_message(event.error))
        elif isinstance(event, Planning):
            if self.planning is not None:
                self.handle = await self.out.post(self.planning)
        elif isinstance(event, Running):
            self.start(event.plan)
        elif isinstance(event, Decided) and self.on_decided is not None:
            await self.on_decided(self, event)

    def start(self, plan: ResetPlan | None) -> None:
        self.plan = plan
        if self.title is None and plan is not None:
            self.title = reset_title(plan)
        self.progress = Progress(
            self.out, self.handle, self.render_progress, self.pace.interval, self.pace.clock
        )

    def render_progress(self) -> Message:
        return self.frame(
            render_progress(self.title or "Reset", self.asked, self.plan, self.events)
        )

    async def end(self, outcome: Outcome) -> ResetResult | None:
        """Write the outcome in place of the progress; return the reset's result, if it ended."""
        if not isinstance(outcome, Done | Failed):
            return None
        if self.progress is not None:
            self.handle = await self.progress.stop()
        if isinstance(outcome, Failed):
            await self.fail(outcome.error)
            return None
        body = render_result(self.title or "Reset", self.asked, outcome.result)
        self.handle = await self.out.update(self.handle, self.frame(body))
        return outcome.result

    async def fail(self, exc: GpubotError) -> None:
        """Say why the request failed: in its message, or to the asker if it has none."""
        if self.handle is None and self.progress is None:
            await self.out.reply(error_message(exc))
        else:
            self.handle = await self.out.update(self.handle, self.frame(error_message(exc)))
