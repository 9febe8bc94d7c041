"""A person's own page (Slack's Home tab): their processes, then the fleet summary (pure).

A page holds more parts than a message but no table (Slack renders tables in messages only),
so the fleet summary is rendered with ``use_table=False``: the same rows as preformatted text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpubot.chat.fleet_view import proc_label, render_fleet
from gpubot.chat.interrupted import Interrupted, interrupted_parts
from gpubot.chat.layout import MAX_PAGE_PARTS, Budget
from gpubot.chat.message import Code, Date, Heading, Kind, Mention, Message, Section, bold, ctx
from gpubot.core.maint import Window
from gpubot.core.models import NodeSnapshot
from gpubot.core.usage.report import Line


def render_home(
    user_id: str,
    linux_user: str | None,
    snapshots: Sequence[NodeSnapshot],
    failed: Mapping[str, str],
    *,
    seconds: float,
    now: float,
    idle_hours: Mapping[str, float] | None = None,
    interrupted: Interrupted | None = None,
) -> Message:
    """Render the Home tab for ``user_id``; ``idle_hours``: GPU-hours held idle per Linux user
    (None: not known); ``interrupted``: shown first until reviewed."""
    b = Budget(MAX_PAGE_PARTS)
    b.add(Heading("GPU fleet"))
    for part in interrupted_parts(interrupted, buttons=True):
        b.add(part)
    if linux_user is None:
        unmapped = (
            "Hello ",
            Mention(user_id),
            ". Your chat account is not mapped to a Linux user, so every reset you ask for "
            "needs on-call approval. Ask an admin to add you to ",
            Code("[users]"),
            ".",
        )
        b.add(Section(unmapped))
    else:
        _add_mine(b, linux_user, snapshots, idle_hours)
    if idle_hours:
        top = list(idle_hours.items())[:MAX_IDLE_USERS]
        more = len(idle_hours) - len(top)
        held_by = " · ".join(f"{u} {h:.1f}" for u, h in top)
        b.add(ctx(f"GPU-hours held idle: {held_by}" + (f" · and {more} more" if more else "")))
    fleet = render_fleet(
        snapshots, failed, seconds=seconds, title="Fleet", use_table=False, limit=b.room - 1
    )
    if fleet.title is not None:
        b.add(Heading(fleet.title))
    for part in fleet.body:
        b.add(part)
    help_ = (" · type ", Code("/gpu help"), " in any channel")
    b.add(ctx(("refreshed ", Date(now), *help_)))
    return b.message(kind=Kind.PAGE)


def _add_mine(
    b: Budget,
    linux_user: str,
    snapshots: Sequence[NodeSnapshot],
    idle_hours: Mapping[str, float] | None,
) -> None:
    """Add the viewer's own processes, and the GPU-hours they hold idle."""
    mine = [(s.node, p) for s in snapshots for p in s.processes if p.user == linux_user]
    b.add(Section((bold("Your processes"), " (Linux user ", Code(linux_user), f"): {len(mine)}")))
    lines = [f"{node} GPU {p.gpu_index}: {proc_label(p)}" for node, p in mine]
    shown = b.add_pre(lines[:200], reserve=40) if lines else 0
    if shown < len(mine):
        b.add(ctx(f"… and {len(mine) - shown} more"))
    held = (idle_hours or {}).get(linux_user)
    if held:
        how = (
            "Your processes keep memory on GPUs that have been at 0 % for hours; free them with ",
            Code("/gpu reset NODE gpu N pid P"),
            ", or ",
            bold("Free it"),
            " in my direct message.",
        )
        held_s = bold(f"You hold GPUs idle: {held:.1f} GPU-hours so far.")
        b.add(Section(("⏳ ", held_s, " ", *how)))


MAX_IDLE_USERS = 20  # owners named in the fleet's idle line (most GPU-hours first)


def render_refused_home(user_id: str, reason: str, *, now: float) -> Message:
    """Render the Home tab for an account gpubot refuses (no fleet data is shown)."""
    body = (
        Section(("Hello ", Mention(user_id), ". ⛔ ", reason, ".")),
        ctx(("checked ", Date(now))),
    )
    return Message("GPU fleet", body, kind=Kind.PAGE)


MAX_WINDOWS = 10  # maintenance windows listed on the Home tab (soonest first)


def with_windows(page: Message, windows: Sequence[Window], now: float) -> Message:
    """Return the Home tab with the maintenance windows open or planned, if it has room: a
    person sees before claiming that the node goes down on Saturday."""
    if not windows or len(page.body) >= MAX_PAGE_PARTS:
        return page
    shown = [f"{w.node} {w.shown(now)}" for w in windows[:MAX_WINDOWS]]
    more = len(windows) - len(shown)
    line = ctx("🛠 " + " · ".join(shown) + (f" · and {more} more" if more else ""))
    return replace(page, body=(*page.body[:-1], line, page.body[-1]))


def with_week(page: Message, week: Line | None) -> Message:
    """Return the Home tab with the viewer's GPU-hours of the last 7 days, if it has room."""
    if week is None or len(page.body) >= MAX_PAGE_PARTS:
        return page
    figures = f"{week.hours('busy'):.1f} busy · {week.hours('idle'):.1f} idle"
    line = ctx(
        f"Your GPU-hours, last 7 days: {figures} · {week.hours('unused'):.1f} claimed unused"
    )
    return replace(page, body=(*page.body[:-1], line, page.body[-1]))
