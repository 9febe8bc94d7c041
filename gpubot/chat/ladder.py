"""The reclaim ladder's messages and buttons, for every front end (``services.ladder``). The
last step's on-call *Free it* is a forced reset through the approval flow, carrying the idle
evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.chat.errors import error_message
from gpubot.chat.flows import Flows
from gpubot.chat.holders import free_it
from gpubot.chat.idle import free_button
from gpubot.chat.layout import MAX_FALLBACK, Budget, clip
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Mention,
    Message,
    Section,
    Sentence,
    Span,
    Style,
    bold,
    clipped,
    ctx,
    note,
)
from gpubot.chat.surface import Surface
from gpubot.core.policy import Person
from gpubot.core.usage.ladder import Step
from gpubot.errors import GpubotError
from gpubot.services.ladder import LadderNotice, ReclaimLadder

ACTION_KEEP = "gpubot_ladder_keep"  # the value is the finding's key text
ACTION_ONCALL_FREE = "gpubot_ladder_free"  # on-call's Free it: the finding's key text


def oncall_free_button(key: str, node: str, gpu: int) -> Action:
    """Return on-call's *Free it*: a forced reset, asked of the approvers."""
    ask = Confirm(
        f"Ask to free {node} GPU {gpu}?",
        "This asks the on-call approvers for a forced reset of the idle holder; nothing is "
        "killed until one approves.",
        confirm="Ask",
        deny="Cancel",
        style=Style.DANGER,
    )
    return Action(ACTION_ONCALL_FREE, "Free it (on-call)", key, Style.DANGER, ask)


def _what(n: LadderNotice) -> list[Span]:
    f = n.finding
    said: list[Span] = [bold(f"{f.node} GPU {f.gpu}"), ": ", clipped(800, Sentence(f.summary))]
    if f.workload:
        said += [" · workload: ", clipped(200, Code(f.workload))]
    return [*said, NL, "Evidence: ", Sentence(n.evidence.text())]


def render_ladder(n: LadderNotice, owners: Sequence[str]) -> Message:
    """Render one step: ``owners`` are the owner's chat ids (named in the channel post)."""
    f, key = n.finding, n.rung.finding
    gpu = n.rung.gpu
    pid = f.holder.split(":", 1)[0]
    who: list[Span] = [Mention(u) for u in owners] or [Code(n.rung.owner)]
    b = Budget()
    if n.step in (Step.DM, Step.REMIND):
        head = "Reminder: your" if n.step is Step.REMIND else "Your"
        title = f"{head} job holds {f.node} GPU {gpu} idle"
        b.add(
            Section(
                (
                    "👋 ",
                    bold(title),
                    NL,
                    "Others are waiting for GPUs. Done? ",
                    bold("Free it"),
                    ". Still need it? ",
                    bold("Keep (reason)"),
                    ".",
                )
            )
        )
        b.add(Section(tuple(_what(n))))
        keep = Action(ACTION_KEEP, "Keep (reason)", key, Style.PRIMARY)
        b.add(Actions((free_button(key, f.node, gpu, pid), keep)))
    elif n.step is Step.POST:
        title = f"{f.node} GPU {gpu} held idle by {n.rung.owner}"
        b.add(Section(("⚠ ", bold(title), NL, "Held idle by ", *who, ", told in a DM.")))
        b.add(Section(tuple(_what(n))))
    else:
        title = f"On-call: {f.node} GPU {gpu} can be freed"
        b.add(
            Section(
                (
                    "🧹 ",
                    bold(title),
                    NL,
                    "Held idle by ",
                    *who,
                    " after a DM, a reminder and a post. ",
                    bold("Free it"),
                    " asks the approvers for a forced reset of only this process.",
                )
            )
        )
        b.add(Section(tuple(_what(n))))
        b.add(Actions((oncall_free_button(key, f.node, gpu),)))
    b.add(ctx(f"gpubot reclaim ladder · step {int(n.step)} of 4 ({n.step.label})"))
    return b.message(clip(title, MAX_FALLBACK))


async def keep(
    ladder: ReclaimLadder, key: str, reason: str, who: Person, out: Surface, *, source: str
) -> None:
    """The owner keeps the GPU: the ladder stops, with the reason (audited as ``source:id``)."""
    try:
        by = f"{source}:{who.id}"
        rung = await ladder.keep(key, by=by, user=who.linux_user, reason=reason)
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    where = f"{rung.node} GPU {rung.gpu}"
    await out.reply(
        note("✋ ", where, " kept: the reclaim ladder stops (", rung.kept_reason or "", ")")
    )


async def oncall_free(
    flows: Flows, ladder: ReclaimLadder, key: str, who: Person, out: Surface
) -> None:
    """On-call's *Free it*: the holder's reset as ``who``'s request, with the idle evidence
    (someone else's process: the approvers decide)."""
    try:
        evidence = await ladder.evidence(key)
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    await ladder.free_asked(key, by=f"{flows.source}:{who.id}", evidence=evidence)
    await free_it(flows, key, who, out, evidence=evidence.text())
