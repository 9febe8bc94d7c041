"""The buttons of alerts, idle-holder DMs and the reclaim ladder, typed on Matrix (which has no
buttons): each message says the words (``matrix.render.typed``), and typing them runs the flow
Slack's button runs, as the sender.

- ``!gpu free KEY``: the owner's own reset of the idle holder (``chat.holders.free_it``);
- ``!gpu snooze 1h|1d KEY``: snooze the finding (audited as ``matrix:@who:server``);
- ``!gpu keep KEY because REASON``: keep the GPU, and the reclaim ladder stops;
- ``!gpu oncall-free KEY``: on-call asks the approvers to free the holder, with its evidence;
- ``!gpu keep claim ID``: the idle claim's *Keep* (``chat.claims.ClaimDesk.click``);
- ``!gpu free KEY`` of an intruder on a claimed GPU: the claim's *Free it* (``free_intruder``).

The claims' other buttons are the claims' own commands (``matrix.render.claim_typed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.chat import claim_view
from gpubot.chat.errors import error_message
from gpubot.chat.flows import Flows
from gpubot.chat.holders import Snoozer, free_it, snooze
from gpubot.chat.ladder import keep, oncall_free
from gpubot.chat.message import note
from gpubot.chat.surface import Surface
from gpubot.core.claims.rules import CLAIM_INTRUDER
from gpubot.core.health.kinds import parse_key
from gpubot.core.policy import Person
from gpubot.errors import GpubotError, UsageError
from gpubot.services.ladder import ReclaimLadder

FRONT = "matrix"  # the audit's name of who acted: "matrix:@who:server"
VERBS = ("free", "snooze", "keep", "oncall-free")
USAGE = (
    "usage: !gpu free KEY, !gpu snooze 1h|1d KEY, !gpu keep KEY because REASON, "
    "!gpu oncall-free KEY (KEY as the message gives it), or !gpu keep claim ID"
)
NO_SWEEPS = "Sweeps are not set up in this gpubot: nothing to snooze or keep."


@dataclass(frozen=True)
class Typed:
    """What the typed buttons run: the flows, the snoozer and the ladder (None: no sweeps)."""

    flows: Flows
    snoozer: Snoozer | None = None
    ladder: ReclaimLadder | None = None


async def typed_action(typed: Typed | None, words: list[str], who: Person, out: Surface) -> bool:
    """Run a typed button (``words``: the line after ``!gpu``, split at most thrice); False if
    the line is none (a command, then)."""
    verb = words[0].lower() if words else ""
    if typed is None or verb not in VERBS:
        return False
    if who.refused is not None:
        await out.reply(error_message(GpubotError(who.refused)))
    elif verb == "free" and len(words) == 2 and intruding(words[1]):
        await typed.flows.claims.free_intruder(words[1], who, out)
    elif verb == "free" and len(words) == 2:
        await free_it(typed.flows, words[1], who, out)
    elif verb == "keep" and len(words) == 3 and words[1].lower() == "claim":
        if words[2].isdigit():
            await typed.flows.claims.click(claim_view.ACTION_KEEP, words[2], who, out)
        else:
            await out.reply(note(f"⚠ not a claim id: {words[2][:20]!r}; {USAGE}"))
    elif verb == "snooze" and len(words) == 3:
        if typed.snoozer is None:
            await out.reply(note(NO_SWEEPS))
        else:
            await snooze(typed.snoozer, words[2], words[1], by=f"{FRONT}:{who.id}", out=out)
    elif verb == "keep" and len(words) == 4 and words[2].lower() == "because":
        if typed.ladder is None:
            await out.reply(note(NO_SWEEPS))
        else:
            await keep(typed.ladder, words[1], words[3], who, out, source=FRONT)
    elif verb == "oncall-free" and len(words) == 2 and typed.ladder is not None:
        await oncall_free(typed.flows, typed.ladder, words[1], who, out)
    else:
        await out.reply(note(f"⚠ {USAGE}"))
    return True


def intruding(key: str) -> bool:
    """Whether ``key`` is an intruder's on a claimed GPU (whose *Free it* is the claim's)."""
    try:
        return parse_key(key).kind == CLAIM_INTRUDER
    except UsageError:
        return False  # ``free_it`` says why in one line
