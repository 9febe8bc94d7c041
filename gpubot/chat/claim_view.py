"""Messages of claims and the queue, for every front end."""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Context,
    Date,
    DateStyle,
    Mention,
    Message,
    Section,
    Span,
    Style,
    Table,
    Text,
    bold,
)
from gpubot.core import durations
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import Claim, Conflict, Intruder, Wait, WaitState, cuda_visible
from gpubot.core.timefmt import iso

ACTION_TAKE = "gpubot_claim_take"  # value: the place in the queue
ACTION_LEAVE = "gpubot_queue_leave"  # value: the place in the queue
ACTION_JOIN = "gpubot_queue_join"  # value: the ``wait`` command that queues
ACTION_KEEP = "gpubot_claim_keep"  # value: the claim id
ACTION_RELEASE = "gpubot_claim_release"  # value: the claim id
ACTION_FREE_INTRUDER = "gpubot_claim_free"  # value: the intruder finding's key text


def until(t: float) -> Date:
    """Return a claim's end, shown as a time."""
    return Date(t, DateStyle.TIME)


def gpus_text(gpus: Sequence[int]) -> str:
    """Return "GPU 2" / "GPUs 2,3"."""
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g) for g in gpus)


def claimed_line(c: Claim) -> Text:
    """Return "claimed by <person> until 14:00 · note"."""
    out: list[Span] = ["claimed by ", Mention(c.chat_id), f" ({c.user})", " until ", until(c.end)]
    if c.note:
        out += [" · ", c.note]
    return tuple(out)


def render_granted(claims: Sequence[Claim], *, title: str = "Claimed") -> Message:
    """Answer a claim: which GPUs, until when, and the environment to use."""
    c0 = claims[0]
    gpus = [c.gpu for c in claims]
    env = cuda_visible([c.gpu_uuid for c in claims])
    head: Text = ("✅ ", bold(c0.node, " ", gpus_text(gpus)), " claimed until ", until(c0.end))
    note_part: tuple[Span, ...] = (" · ", c0.note) if c0.note else ()
    body = (
        Section((*head, *note_part)),
        Section(
            ("Use exactly these GPUs (UUIDs: CUDA's order is not nvidia-smi's): ", NL, Code(env))
        ),
        Context((("`/gpu extend` makes it last longer; `/gpu release` ends it.",),)),
    )
    return Message(
        f"{title} · {c0.node}", body, fallback=f"claimed {c0.node} {gpus_text(gpus)}; {env}"
    )


def render_conflict(conflict: Conflict, node: str, wait: str) -> Message:
    """Refuse a claim: who holds which GPU until when, and an offer to queue with ``wait``."""
    rows: list[Section] = []
    for c in conflict.held:
        rows.append(Section((bold(f"GPU {c.gpu}"), " is ", *claimed_line(c))))
    for w in conflict.holds:
        rows.append(
            Section(
                (
                    bold(gpus_text(w.offered)),
                    " are held for ",
                    Mention(w.chat_id),
                    " (next in the queue) until ",
                    until(w.hold_until or 0.0),
                )
            )
        )
    offer = Actions((Action(ACTION_JOIN, "Queue me", wait, Style.PRIMARY),), group="queue")
    return Message(
        f"Not claimed · {node}",
        (
            Section(("⚠ Not claimed: those GPUs are taken.",)),
            *rows,
            Section(("Queue with ", Code(f"/gpu {wait}"), " and you get a DM when they are free.")),
            offer,
        ),
        fallback=f"not claimed: {node} GPUs are taken",
    )


def render_claims(claims: Sequence[Claim], scope: str, now: float) -> Message:
    """Show active claims as a table."""
    if not claims:
        return Message(f"Claims · {scope}", (Section((f"No active claims ({scope}).",)),))
    rows: list[tuple[str, ...]] = [("Node", "GPU", "User", "Until", "Left", "Note")]
    for c in claims:
        end = _hhmm(c.end)
        rows.append(
            (c.node, str(c.gpu), c.user, end, durations.format(c.end - now, "minutes"), c.note)
        )
    people = tuple(dict.fromkeys(c.chat_id for c in claims))
    who: list[Span] = ["Claimed by "]
    for i, p in enumerate(people):
        who += ([", "] if i else []) + [Mention(p)]
    return Message(
        f"Claims · {scope}",
        (Table(tuple(rows), wrap=(5,)), Context((tuple(who),))),
        fallback=f"{len(claims)} active claim(s)",
    )


def render_queue(waits: Sequence[Wait], node: str | None) -> Message:
    """Show the queue, first in line first, each with a Leave button for its person."""
    title = "Queue · " + (node or "all")
    if not waits:
        return Message(title, (Section(("No one is waiting.",)),))
    body: list[Section | Actions] = []
    for i, w in enumerate(waits, 1):
        what = gpus_text(w.gpus) if w.gpus else f"any {w.count}"
        state: Text = ("waiting",)
        if w.state is WaitState.OFFERED:
            state = ("held for them: ", gpus_text(w.offered), " until ", until(w.hold_until or 0))
        body.append(
            Section(
                (
                    f"{i}. ",
                    Mention(w.chat_id),
                    f" · {w.node} {what} · ",
                    *state,
                    f" (place {w.id})",
                ),
                Action(ACTION_LEAVE, "Leave", str(w.id)),
            )
        )
    return Message(title, tuple(body), fallback=f"{len(waits)} waiting")


def render_queued(w: Wait, ahead: int) -> Message:
    """Answer ``wait``."""
    what = gpus_text(w.gpus) if w.gpus else f"any {w.count} GPU(s)"
    return Message(
        f"Queued · {w.node}",
        (
            Section(
                (
                    f"⏳ You are in line for {w.node} {what} (place {w.id}, {ahead} ahead). ",
                    "You get a DM when it is free.",
                ),
                Action(ACTION_LEAVE, "Leave the queue", str(w.id)),
            ),
        ),
        fallback=f"queued for {w.node} {what}",
    )


def render_offer(w: Wait, uuids: Sequence[str], *, hold: bool) -> Message:
    """The DM to the first in line: the GPUs are free (held for them until …, with Claim)."""
    what = f"{w.node} {gpus_text(w.offered)}"
    if not hold:
        return Message(
            f"Free · {w.node}",
            (Section(("🟢 ", bold(what), " is free now (you asked to be told).")),),
            fallback=f"{what} is free",
        )
    return Message(
        f"Free · {w.node}",
        (
            Section(
                (
                    "🟢 ",
                    bold(what),
                    " is free and held for you until ",
                    until(w.hold_until or 0),
                    ".",
                )
            ),
            Section(("Claim it with one click, or type ", Code(f"/gpu take {w.id}"), ".")),
            Context(((Code(cuda_visible(list(uuids))),),)),
            Actions(
                (
                    Action(ACTION_TAKE, "Claim", str(w.id), Style.PRIMARY),
                    Action(ACTION_LEAVE, "Leave the queue", str(w.id)),
                ),
                group=f"wait-{w.id}",
            ),
        ),
        fallback=f"{what} is free and held for you",
    )


def render_lapsed(w: Wait) -> Message:
    """The DM when a hold ran out."""
    return Message(
        f"Hold ended · {w.node}",
        (
            Section(
                (
                    f"⌛ The hold of {w.node} {gpus_text(w.offered)} ran out; ",
                    "the next in line is told.",
                )
            ),
        ),
    )


def render_expired(c: Claim) -> Message:
    """The DM when a claim's time ran out."""
    return Message(
        f"Claim ended · {c.node}",
        (Section((f"⌛ Your claim of {c.node} GPU {c.gpu} ended (its time ran out).",)),),
    )


def render_ended(claims: Sequence[Claim], verb: str) -> Message:
    """Answer release (or extend's cuts)."""
    parts = [f"{c.node} GPU {c.gpu}" for c in claims]
    return Message(None, (Section((f"✅ {verb}: " + ", ".join(parts),)),))


def render_extended(done: Sequence[tuple[Claim, bool]]) -> Message:
    """Answer ``extend``: each claim's new end, and whether a limit cut it."""
    rows: list[Section] = []
    for c, cut in done:
        extra = " (cut to the longest a claim may last)" if cut else ""
        rows.append(Section((f"✅ {c.node} GPU {c.gpu} now until ", until(c.end), extra)))
    return Message("Extended", tuple(rows))


def wait_command(cmd: cc.ClaimGpus) -> str:
    """Return the ``wait`` command that queues for what ``cmd`` asked."""
    what = f"gpu {','.join(map(str, cmd.gpus))}" if cmd.gpus else f"any {cmd.count}"
    return f"wait {cmd.node} {what} for {durations.format(cmd.duration_s)}"


def _hhmm(t: float) -> str:
    return iso(t)[11:16] + "Z"  # a table cell is plain text: UTC, said so


def intruder_reason(i: Intruder) -> Text:
    """What the approvers read: the GPU was claimed, by whom, since when, what intrudes."""
    c = i.claim
    return (
        "🔒 ",
        bold(f"{c.node} GPU {c.gpu}"),
        " is claimed by ",
        Mention(c.chat_id),
        f" ({c.user}) since ",
        Date(c.start),
        " until ",
        until(c.end),
        (f" · {c.note}" if c.note else ""),
        NL,
        f"Unclaimed use: {i.what()}, started {i.relative()}.",
    )


def render_intruder(i: Intruder, key: str) -> Message:
    """The DM to the claimant: someone else uses their GPU; *Free it* asks on-call."""
    c = i.claim
    free = Action(
        ACTION_FREE_INTRUDER,
        "Free it",
        key,
        Style.DANGER,
        Confirm(
            f"Free {c.node} GPU {c.gpu}?",
            "It is someone else's process: an on-call approver decides before anything is killed.",
            confirm="Ask on-call",
            deny="Cancel",
            style=Style.DANGER,
        ),
    )
    return Message(
        f"Someone uses your claimed GPU · {c.node}",
        (
            Section(("⚠ ", *intruder_reason(i))),
            Actions((free,), group=f"intruder-{c.id}"),
            Context((("Free it kills it only after an on-call approver says so.",),)),
        ),
        fallback=f"{i.what()} uses {c.node} GPU {c.gpu}, which you claimed",
    )


def render_idle_asked(c: Claim, idle_s: float) -> Message:
    """The DM to the holder of an idle claim: Keep or Release."""
    keep = Action(ACTION_KEEP, "Keep", str(c.id), Style.PRIMARY)
    release = Action(ACTION_RELEASE, "Release", str(c.id))
    return Message(
        f"Idle claim · {c.node}",
        (
            Section(
                (
                    "💤 Your claim of ",
                    bold(f"{c.node} GPU {c.gpu}"),
                    f" has been idle (0 %) for {durations.format(idle_s, 'minutes')}. Keep it,"
                    " or release it for others.",
                )
            ),
            Actions((keep, release), group=f"idle-claim-{c.id}"),
            Context((("Still idle as long again without a Keep, it is released.",),)),
        ),
        fallback=f"your claim of {c.node} GPU {c.gpu} is idle: keep or release it",
    )


def render_idle_released(c: Claim) -> Message:
    """The DM when an idle claim no one kept was released."""
    return Message(
        f"Idle claim released · {c.node}",
        (Section((f"⌛ Your claim of {c.node} GPU {c.gpu} was released: it stayed idle.",)),),
    )
