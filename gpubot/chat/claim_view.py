"""Messages of claims and the queue, for every front end."""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
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
    ctx,
    joined,
    note,
)
from gpubot.core import durations
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import Claim, Conflict, Intruder, Wait, WaitState, cuda_visible
from gpubot.core.maint import Ahead, ProcsAhead, clock
from gpubot.core.timefmt import iso

ACTION_TAKE = "gpubot_claim_take"  # value: the place in the queue
ACTION_LEAVE = "gpubot_queue_leave"  # value: the place in the queue
ACTION_JOIN = "gpubot_queue_join"  # value: the ``wait`` command that queues
ACTION_KEEP = "gpubot_claim_keep"  # value: the claim id
ACTION_RELEASE = "gpubot_claim_release"  # value: "ID NODE GPU" (the claim; a bare id before)
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
        ctx((Code("/gpu extend"), " makes it last longer; ", Code("/gpu release"), " ends it.")),
    )
    return Message(
        f"{title} · {c0.node}", body, fallback=f"claimed {c0.node} {gpus_text(gpus)}; {env}"
    )


def render_conflict(conflict: Conflict, node: str, wait: str) -> Message:
    """Refuse a claim: who holds which GPU until when, and an offer to queue with ``wait``."""
    rows = [Section((bold(f"GPU {c.gpu}"), " is ", *claimed_line(c))) for c in conflict.held]
    for w in conflict.holds:
        held = (bold(gpus_text(w.offered)), " are held for ", Mention(w.chat_id))
        rows.append(Section((*held, " (next in the queue) until ", until(w.hold_until or 0.0))))
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
        return note(f"No active claims ({scope}).", title=f"Claims · {scope}")
    rows: list[tuple[str, ...]] = [("Node", "GPU", "User", "Until", "Left", "Note")]
    for c in claims:
        end = _hhmm(c.end)
        rows.append(
            (c.node, str(c.gpu), c.user, end, durations.format(c.end - now, "minutes"), c.note)
        )
    people = joined(Mention(p) for p in dict.fromkeys(c.chat_id for c in claims))
    return Message(
        f"Claims · {scope}",
        (Table(tuple(rows), wrap=(5,)), ctx(("Claimed by ", *people))),
        fallback=f"{len(claims)} active claim(s)",
    )


def render_queue(waits: Sequence[Wait], node: str | None) -> Message:
    """Show the queue, first in line first, each with a Leave button for its person."""
    title = "Queue · " + (node or "all")
    if not waits:
        return note("No one is waiting.", title=title)
    body: list[Section | Actions] = []
    for i, w in enumerate(waits, 1):
        what = gpus_text(w.gpus) if w.gpus else f"any {w.count}"
        state: Text = ("waiting",)
        if w.state is WaitState.OFFERED:
            state = ("held for them: ", gpus_text(w.offered), " until ", until(w.hold_until or 0))
        who = (f"{i}. ", Mention(w.chat_id), f" · {w.node} {what} · ")
        leave = Action(ACTION_LEAVE, "Leave", str(w.id))
        body.append(Section((*who, *state, f" (place {w.id})"), leave))
    return Message(title, tuple(body), fallback=f"{len(waits)} waiting")


def render_queued(w: Wait, ahead: int) -> Message:
    """Answer ``wait``."""
    what = gpus_text(w.gpus) if w.gpus else f"any {w.count} GPU(s)"
    line = f"⏳ You are in line for {w.node} {what} (place {w.id}, {ahead} ahead). "
    leave = Action(ACTION_LEAVE, "Leave the queue", str(w.id))
    body = (Section((line, "You get a DM when it is free."), leave),)
    return Message(f"Queued · {w.node}", body, fallback=f"queued for {w.node} {what}")


def render_offer(w: Wait, uuids: Sequence[str], *, hold: bool) -> Message:
    """The DM to the first in line: the GPUs are free (held for them until …, with Claim)."""
    what = f"{w.node} {gpus_text(w.offered)}"
    if not hold:
        said = ("🟢 ", bold(what), " is free now (you asked to be told).")
        return note(*said, title=f"Free · {w.node}", fallback=f"{what} is free")
    held = ("🟢 ", bold(what), " is free and held for you until ", until(w.hold_until or 0), ".")
    take = Action(ACTION_TAKE, "Claim", str(w.id), Style.PRIMARY)
    leave = Action(ACTION_LEAVE, "Leave the queue", str(w.id))
    body = (
        Section(held),
        Section(("Claim it with one click, or type ", Code(f"/gpu take {w.id}"), ".")),
        ctx((Code(cuda_visible(list(uuids))),)),
        Actions((take, leave), group=f"wait-{w.id}"),
    )
    return Message(f"Free · {w.node}", body, fallback=f"{what} is free and held for you")


def render_lapsed(w: Wait) -> Message:
    """The DM when a hold ran out."""
    said = f"⌛ The hold of {w.node} {gpus_text(w.offered)} ran out; the next in line is told."
    return note(said, title=f"Hold ended · {w.node}")


def render_maint_ahead(a: Ahead) -> Message:
    """The DM ahead of a maintenance window that a claim of theirs runs into."""
    w = a.window
    said = (
        f"🛠 {w.node} is down for {w.shown(w.created)}. Your claim of {w.node} GPU {a.gpu} runs "
        f"until {clock(a.claim_end, w.start)} UTC: save your work before {clock(w.start, w.start)} "
        "UTC; what still runs then may be stopped."
    )
    return note(said, title=f"Maintenance ahead · {w.node}")


def render_procs_ahead(a: ProcsAhead) -> Message:
    """The DM ahead of a maintenance window on a node where the person's processes run."""
    w = a.window
    shown = ", ".join(f"GPU {g} pid {p}" for g, p in a.held[:8])
    more = f" and {len(a.held) - 8} more" if len(a.held) > 8 else ""
    said = (
        f"🛠 {w.node} is down for {w.shown(w.created)}. Your processes run there ({shown}{more}): "
        f"save your work before {clock(w.start, w.start)} UTC; what still runs then may be "
        "stopped."
    )
    return note(said, title=f"Maintenance ahead · {w.node}")


def render_expired(c: Claim) -> Message:
    """The DM when a claim's time ran out."""
    said = f"⌛ Your claim of {c.node} GPU {c.gpu} ended (its time ran out)."
    return note(said, title=f"Claim ended · {c.node}")


def render_ended(claims: Sequence[Claim], verb: str) -> Message:
    """Answer release (or extend's cuts)."""
    return note(f"✅ {verb}: " + ", ".join(f"{c.node} GPU {c.gpu}" for c in claims))


def render_extended(done: Sequence[tuple[Claim, bool]]) -> Message:
    """Answer ``extend``: each claim's new end, and whether a limit cut it."""
    cut_to = " (cut to the longest a claim may last)"
    return Message(
        "Extended",
        tuple(
            Section((f"✅ {c.node} GPU {c.gpu} now until ", until(c.end), cut_to if cut else ""))
            for c, cut in done
        ),
    )


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
    ask = Confirm(
        f"Free {c.node} GPU {c.gpu}?",
        "It is someone else's process: an on-call approver decides before anything is killed.",
        confirm="Ask on-call",
    )
    free = Action(ACTION_FREE_INTRUDER, "Free it", key, Style.DANGER, ask)
    return Message(
        f"Someone uses your claimed GPU · {c.node}",
        (
            Section(("⚠ ", *intruder_reason(i))),
            Actions((free,), group=f"intruder-{c.id}"),
            ctx("Free it kills it only after an on-call approver says so."),
        ),
        fallback=f"{i.what()} uses {c.node} GPU {c.gpu}, which you claimed",
    )


def render_idle_asked(c: Claim, idle_s: float) -> Message:
    """The DM to the holder of an idle claim: Keep or Release."""
    keep = Action(ACTION_KEEP, "Keep", str(c.id), Style.PRIMARY)
    release = Action(ACTION_RELEASE, "Release", f"{c.id} {c.node} {c.gpu}")
    idle = f" has been idle (0 %) for {durations.format(idle_s, 'minutes')}."
    said = (
        "💤 Your claim of ",
        bold(f"{c.node} GPU {c.gpu}"),
        idle,
        " Keep it, or release it for others.",
    )
    return Message(
        f"Idle claim · {c.node}",
        (
            Section(said),
            Actions((keep, release), group=f"idle-claim-{c.id}"),
            ctx("Still idle as long again without a Keep, it is released."),
        ),
        fallback=f"your claim of {c.node} GPU {c.gpu} is idle: keep or release it",
    )


def render_idle_released(c: Claim) -> Message:
    """The DM when an idle claim no one kept was released."""
    said = f"⌛ Your claim of {c.node} GPU {c.gpu} was released: it stayed idle."
    return note(said, title=f"Idle claim released · {c.node}")
