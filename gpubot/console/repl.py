"""The console's loop: ``/gpu …`` lines answered as text through the same flows as Slack's.
Buttons are typed (``approve ID``, ``snooze 1h KEY``, ``free KEY``, …): a message with
buttons says what to type for each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from gpubot.chat.alerts import SNOOZE_ACTION
from gpubot.chat.claim_view import (
    ACTION_FREE_INTRUDER,
    ACTION_JOIN,
    ACTION_KEEP,
    ACTION_LEAVE,
    ACTION_RELEASE,
    ACTION_TAKE,
)
from gpubot.chat.drain_view import ACTION_DRAIN_NODE
from gpubot.chat.flows import Flows
from gpubot.chat.holders import Snoozer, free_it, snooze
from gpubot.chat.idle import ACTION_FREE
from gpubot.chat.message import Action, Message, Section, note, paragraph
from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_RESET_GPU
from gpubot.chat.surface import MessageRef
from gpubot.console.text_render import render_text
from gpubot.core import commands
from gpubot.core.policy import Person
from gpubot.errors import StdoutClosed, UsageError

PROMPT = "gpu> "
CONSOLE = "console:"  # the console's message references: "console:INDEX"
CLAIM_TYPED = {
    ACTION_TAKE: "take {}",
    ACTION_LEAVE: "leave {}",
    ACTION_JOIN: "{}",
    ACTION_KEEP: "keep-claim {}",
    ACTION_RELEASE: "release-claim {}",
    ACTION_FREE_INTRUDER: "free-claim {}",
}
CLAIM_BUTTONS = {  # the claims' buttons, typed: word → action (chat.claims.ClaimDesk.click)
    "keep-claim": ACTION_KEEP,
    "release-claim": ACTION_RELEASE,
    "free-claim": ACTION_FREE_INTRUDER,
}
HOLDER_USAGE = (
    "snooze TIME KEY  — snooze an alert's finding 1h to 1d (console; KEY as the alert gives it)\n"
    "free KEY  — free the GPU an idle holder keeps (console): your own reset of that pid"
)
NextLine = Callable[[], Awaitable[str | None]]  # the next line typed (None: the end of input)


@dataclass(frozen=True)
class ConsoleParts:
    """What the console needs of the app: its flows, a snoozer, its lifecycle and its close."""

    flows: Flows
    snoozer: Snoozer
    running: Callable[[], AbstractAsyncContextManager[Any]]
    close: Callable[[], Awaitable[None]]


def typed(action: Action) -> str | None:
    """Return what to type at the console for ``action`` (None: nothing, or said below)."""
    snooze = SNOOZE_ACTION.match(action.id)
    if snooze is not None:
        return f"snooze {snooze[1]} {action.value}"
    if action.id == ACTION_FREE:
        return f"free {action.value}"
    if action.id == ACTION_RESET_GPU:
        node, _, gpu = action.value.rpartition(":")
        return f"reset {node} gpu {gpu}"
    if action.id == ACTION_DRAIN_NODE:
        node, _, reason = action.value.partition(" ")
        return f"drain {node} because {reason}" if reason else f"drain {node}"
    form = CLAIM_TYPED.get(action.id)
    return None if form is None else form.format(action.value)


async def holder_line(
    flows: Flows, line: str, who: Person, out: TextSurface, snoozer: Snoozer | None
) -> bool:
    """Run an alert's or a claim's button, typed; False if ``line`` is neither."""
    words = line.split(maxsplit=2)
    if words[:1] and words[0] in CLAIM_BUTTONS and len(words) == 2:
        action = CLAIM_BUTTONS[words[0]]
        if action == ACTION_FREE_INTRUDER:
            await flows.claims.free_intruder(words[1], who, out)
        else:
            await flows.claims.click(action, words[1], who, out)
    elif words[:1] == ["free"] and len(words) == 2:
        await free_it(flows, words[1], who, out)
    elif words[:1] == ["snooze"] and len(words) == 3:
        if snoozer is None:
            await out.reply(note("Sweeps are not set up in this gpubot: nothing to snooze."))
        else:
            by = who.id if who.id.startswith("console:") else f"console:{who.id}"
            await snooze(snoozer, words[2], words[1], by=by, out=out)
    elif words[:1] in (["free"], ["snooze"]):
        raise UsageError("usage: snooze TIME KEY, or free KEY (KEY as an alert gives it)")
    else:
        return False
    return True


def render(msg: Message) -> str:
    """Return a message as console text (buttons say the words to type)."""
    text = render_text(msg, typed)
    for a in msg.actions:
        if a.id == ACTION_APPROVE:
            n = a.value
            text += f"\n→ an approver types: approve {n}   (or: deny {n})"
    return text


class TextSurface:
    """Collects a command's messages as text; ``echo`` prints what is new as it comes."""

    def __init__(self, echo: Callable[[str], None] | None = None) -> None:
        self.echo = echo
        self.messages: list[Message] = []
        self._printed: dict[int, list[str]] = {}

    def _show(self, index: int) -> None:
        if self.echo is None:
            return
        lines = render(self.messages[index]).splitlines()
        before = self._printed.get(index, [])
        new = [line for line in lines if line not in before]
        if new:
            self.echo("\n".join(new))
        self._printed[index] = lines

    def _add(self, msg: Message) -> int:
        self.messages.append(msg)
        self._show(len(self.messages) - 1)
        return len(self.messages) - 1

    async def reply(self, msg: Message) -> None:
        self._add(msg)

    async def post(self, msg: Message, *, channel: str | None = None) -> MessageRef | None:
        """Show a message; one for another channel (on-call) is shown but not kept to update."""
        index = self._add(msg)
        return None if channel is not None else MessageRef(f"{CONSOLE}{index}")

    async def update(self, handle: MessageRef | None, msg: Message) -> MessageRef | None:
        """Replace a message of this command, or show a new one."""
        mine = handle is not None and handle.startswith(CONSOLE)
        index = int(handle.removeprefix(CONSOLE)) if handle is not None and mine else -1
        if not 0 <= index < len(self.messages):
            return MessageRef(f"{CONSOLE}{self._add(msg)}")
        self.messages[index] = msg
        self._show(index)
        return handle

    def text(self) -> str:
        return "\n\n".join(render(m) for m in self.messages)


async def answer(
    flows: Flows,
    line: str,
    who: Person,
    *,
    echo: Callable[[str], None] | None = None,
    snoozer: Snoozer | None = None,
) -> str:
    """Run one ``/gpu …`` line as ``who``; return the text it would post. ``snoozer``: what
    snoozes a finding (``SweepService.snooze``; None: no sweeps here)."""
    out = TextSurface(echo)
    try:
        if await holder_line(flows, line.strip().removeprefix("/gpu "), who, out, snoozer):
            return out.text()
        cmd = commands.parse(line, decisions=True)
        flows.check(cmd)
    except UsageError as exc:
        verb = line.split()[1:2] if line.strip().startswith("/gpu") else line.split()[:1]
        hint = commands.help_text(verb[0]) if verb and verb[0].lower() in commands.USAGE else ""
        text = f"⚠ {exc}\n{hint}".strip()
        if echo is not None:
            echo(text)
        return text
    if isinstance(cmd, commands.Help):
        text = commands.help_text(cmd.topic, decisions=True)
        if cmd.topic is None:
            text += "\n" + HOLDER_USAGE
        await out.reply(Message(None, (Section(paragraph(text)),)))
        return out.text()
    await flows.run(cmd, who, out, text=line.strip())
    return out.text()


def echo(text: str) -> None:
    """Print an answer; nobody reading them stops the console (past the flows' errors)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise StdoutClosed from None


async def repl(parts: ConsoleParts, who: Person, lines: Sequence[str] | NextLine) -> int:
    """Run the app's lifecycle and answer ``lines`` (or ``lines()`` until None, quit or exit)."""
    flows, snoozer = parts.flows, parts.snoozer
    try:
        async with parts.running():
            if not callable(lines):
                for line in lines:
                    await answer(flows, line, who, echo=echo, snoozer=snoozer)
                return 0
            while (typed := await lines()) is not None and typed.strip() not in ("quit", "exit"):
                if typed.strip():
                    await answer(flows, typed, who, echo=echo, snoozer=snoozer)
            return 0
    finally:
        await parts.close()
