"""The reclaim ladder's messages and buttons, for every front end (``services.ladder``). The
last step's on-call *Free it* is a forced reset through the approval flow, carrying the idle
evidence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpubot.chat.claims import Dm
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
    Text,
    bold,
    clipped,
    ctx,
    note,
)
from gpubot.chat.surface import Surface
from gpubot.core.health.hung import HUNG_BUSY
from gpubot.core.policy import Person
from gpubot.core.usage.ladder import Rung, Step
from gpubot.errors import GpubotError
from gpubot.services.ladder import LadderNotice, ReclaimLadder
from gpubot.services.outbox import Outbox

ACTION_KEEP = "gpubot_ladder_keep"  # the value is the finding's key text
ACTION_ONCALL_FREE = "gpubot_ladder_free"  # on-call's Free it: the finding's key text


def oncall_free_button(key: str, node: str, gpu: int) -> Action:
    """Return on-call's *Free it*: a forced reset, asked of the approvers."""
    ask = Confirm(
        f"Ask to free {node} GPU {gpu}?",
        "This asks the on-call approvers for a forced reset of the idle holder; nothing is "
        "killed until one approves.",
        confirm="Ask",
    )
    return Action(ACTION_ONCALL_FREE, "Free it (on-call)", key, Style.DANGER, ask)


def _what(n: LadderNotice) -> Text:
    f = n.finding
    said: list[Span] = [bold(f"{f.node} GPU {f.gpu}"), ": ", clipped(800, Sentence(f.summary))]
    if f.workload:
        said += [" · workload: ", clipped(200, Code(f.workload))]
    return (*said, NL, "Evidence: ", Sentence(n.evidence.text()))


def render_ladder(n: LadderNotice, owners: Sequence[str]) -> Message:
    """Render one step: ``owners`` are the owner's chat ids (named in the channel post)."""
    f, key = n.finding, n.rung.finding
    gpu = n.rung.gpu
    pid = f.holder.split(":", 1)[0]
    who: list[Span] = [Mention(u) for u in owners] or [Code(n.rung.owner)]
    acts: Actions | None = None
    hung = f.kind == HUNG_BUSY
    if n.step in (Step.DM, Step.REMIND):
        head = "Reminder: your" if n.step is Step.REMIND else "Your"
        if hung:
            title = f"{head} job on {f.node} GPU {gpu} looks hung: busy, but no progress"
            asks: Text = ("Is it wedged (an NCCL hang?)? ", bold("Free it"), ". Working? ")
        else:
            title = f"{head} job holds {f.node} GPU {gpu} idle"
            asks = ("Others are waiting for GPUs. Done? ", bold("Free it"), ". Still need it? ")
        intro: Text = ("👋 ", bold(title), NL, *asks, bold("Keep (reason)"), ".")
        keep = Action(ACTION_KEEP, "Keep (reason)", key, Style.PRIMARY)
        acts = Actions((free_button(key, f.node, gpu, pid), keep))
    elif n.step is Step.POST:
        held = "looks hung in the job of" if hung else "held idle by"
        title = f"{f.node} GPU {gpu} {held} {n.rung.owner}"
        intro = ("⚠ ", bold(title), NL, held.capitalize(), " ", *who, ", told in a DM.")
    else:
        title = f"On-call: {f.node} GPU {gpu} can be freed"
        held = "Looks hung in the job of " if hung else "Held idle by "
        then = (" after a DM, a reminder and a post. ", bold("Free it"))
        only = " asks the approvers for a forced reset of only this process."
        intro = ("🧹 ", bold(title), NL, held, *who, *then, only)
        acts = Actions((oncall_free_button(key, f.node, gpu),))
    b = Budget()
    b.add(Section(intro))
    b.add(Section(_what(n)))
    if acts is not None:
        b.add(acts)
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


def ladder_subject(rung: Rung, step: Step, to: str, kind: str = "dm") -> str:
    """Return the outbox's name of one ladder message: "dm:ladder:<finding>:<start>:<step>:<to>"
    (``to``: the chat user of a DM, or with ``kind`` "post" the channel or room of a post)."""
    return f"{kind}:ladder:{rung.finding}:{rung.started_at}:{int(step)}:{to}"


log = logging.getLogger(__name__)


class LadderTeller:
    """Tells the ladder's steps (``LadderNotifier``), each message once through the one outbox:
    steps 1-2 to each of the owner's chat users, through ``dm`` (on whichever front end reaches
    them, ``chat.dm_route``), 3-4 in ``place``."""

    def __init__(
        self,
        dm: Dm,
        place: str | None,
        people: Mapping[str, Sequence[str]],
        outbox: Outbox[Message],
    ) -> None:
        self.dm, self.place, self.people, self.outbox = dm, place, people, outbox

    async def tell(self, notice: LadderNotice) -> bool:
        """DM the owner (steps 1-2) or post in the alerts place (3-4); never raises."""
        owners = tuple(self.people.get(notice.rung.owner, ()))
        said = render_ladder(notice, owners)
        try:
            if notice.step in (Step.DM, Step.REMIND):
                sent = False
                for user in owners:
                    subject = ladder_subject(notice.rung, notice.step, user)
                    sent = await self.dm(user, said, subject) or sent
                if not owners:
                    log.info("reclaim ladder: %s maps to no chat user", notice.rung.owner)
                return sent
            if self.place is None:
                log.warning("reclaim ladder: no alerts place for step %d", int(notice.step))
                return False
            subject = ladder_subject(notice.rung, notice.step, self.place, "post")
            return await self.outbox.send(subject, self.place, said) is not None
        except Exception:  # a step is told at most once; its record stands
            log.exception("reclaim ladder: step %d not told", int(notice.step))
            return False
