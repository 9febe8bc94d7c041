"""The direct message an idle holder's owner gets: what is held idle, *Free it* and *Snooze*,
and who gets it (``tell_idle_owners``, for every front end's alerts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from gpubot.chat.alerts import snooze_buttons
from gpubot.chat.claims import Dm
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.layout import MAX_FALLBACK, Budget, clip
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Date,
    Message,
    Place,
    Section,
    Sentence,
    Span,
    Style,
    Text,
    bold,
    clipped,
    ctx,
)
from gpubot.core import durations
from gpubot.core.alerting import AlertGroup, AlertItem, MessageRef
from gpubot.core.findings import IDLE_HOLDER

ACTION_FREE = "gpubot_free_it"  # the value is the finding's key text
MAX_DM_ITEMS = 10  # idle GPUs detailed in one message (2 blocks each)


def free_button(key_text: str, node: str, gpu: int, pid: str) -> Action:
    """Return the "Free it" button of one idle holder (confirmed before anything happens)."""
    ask = Confirm(
        f"Free {node} GPU {gpu}?",
        f"pid {pid} gets SIGTERM, then SIGKILL if it has not ended after the grace period.",
        confirm="Free it",
    )
    return Action(ACTION_FREE, "Free it", key_text, Style.DANGER, ask)


def render_idle_dm(
    items: Sequence[AlertItem],
    node: str,
    *,
    now: datetime,
    alert: MessageRef | None,
    snooze: Callable[[str], Action],
) -> Message:
    """Render the direct message to one owner about their idle holders on ``node``."""
    found = [i for i in items if i.finding is not None and i.key.gpu is not None]
    idle_s = max((i.finding.idle_s or 0.0 for i in found if i.finding is not None), default=0.0)
    gpus = ", ".join(f"GPU {i.key.gpu}" for i in found)
    title = f"Your job holds {node} {gpus} idle ({durations.format(idle_s, 'people')} at 0 %)"
    b = Budget()
    intro: Text = (
        "👋 ",
        bold(title),
        NL,
        "Others are waiting for GPUs. If you are done, ",
        bold("Free it"),
        " stops the process (your own reset: SIGTERM, then SIGKILL after the grace period). "
        "Not done yet? ",
        bold("Snooze 1 day"),
        ".",
    )
    b.add(Section(intro))
    for item in found[:MAX_DM_ITEMS]:
        f = item.finding
        assert f is not None and item.key.gpu is not None
        said: list[Span] = [bold(f"{node} GPU {item.key.gpu}"), ": "]
        said.append(clipped(800, Sentence(f.summary)))
        if f.owner:
            said += [NL, "owner: ", Code(f.owner)]
            if f.workload:
                said += [" · workload: ", clipped(200, Code(f.workload))]
        b.add(Section(tuple(said)))
        pid = item.key.holder.split(":", 1)[0]
        free = free_button(item.key.text(), node, item.key.gpu, pid)
        b.add(Actions((free, snooze(item.key.text()))))
    if len(found) > MAX_DM_ITEMS:
        b.add(ctx(f"… and {len(found) - MAX_DM_ITEMS} more idle GPU(s) on {node}"))
    where: Text = (" · also in ", Place(alert)) if alert is not None else ()
    b.add(ctx(("gpubot sweep · ", Date(now.timestamp()), *where)))
    return b.message(clip(title, MAX_FALLBACK))


def idle_owners(
    group: AlertGroup, people: Mapping[str, Sequence[str]]
) -> dict[str, list[AlertItem]]:
    """Return chat user → the group's open idle holders whose owner (a Linux user) ``people``
    maps to that user: whom an idle-holder alert is also told by DM, and about what."""
    mine: dict[str, list[AlertItem]] = {}
    for item in group.open:
        f = item.finding
        if f is None or f.kind != IDLE_HOLDER or f.owner is None:
            continue
        for user in people.get(f.owner, ()):
            mine.setdefault(user, []).append(item)
    return mine


def idle_subject(node: str, items: Sequence[AlertItem], user: str) -> str:
    """Return the outbox's name of the idle-holder DM to ``user`` about ``items`` on ``node``:
    "dm:idle:<node>:<gpu>:<pid>:<start>[,…]:<user>" (a holder is a process and its start)."""
    held = ",".join(sorted(f"{i.key.gpu}:{i.key.holder}" for i in items))
    return f"dm:idle:{node}:{held}:{user}"


async def tell_idle_owners(
    group: AlertGroup,
    where: MessageRef | None,
    people: Mapping[str, Sequence[str]],
    own: Dm,
    route: DmRoute | None,
) -> int:
    """DM each owner of the group's open idle holders about them, once each; return how many
    were sent or handed over. A chat user this front end reaches gets it through ``own``, the
    alert ``where`` linked; another front end's gets it through ``route`` (handed over to that
    front end's process, ``chat.dm_route``), without the link, which names this one's message."""
    sent = 0
    for user, items in idle_owners(group, people).items():
        send: Dm = own if route is None or route.reaches(user) else route
        alert = where if send is own else None
        msg = render_idle_dm(items, group.node, now=group.at, alert=alert, snooze=_snooze_day)
        sent += await send(user, msg, idle_subject(group.node, items, user))
    return sent


def _snooze_day(key_text: str) -> Action:
    return snooze_buttons(key_text)[-1]
