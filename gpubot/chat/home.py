"""The App Home tab: the viewer's own processes, then the fleet summary (pure render).

A view is not a message: it holds up to 100 blocks, and no ``table`` block (Slack renders
tables in messages only: the "Surfaces" column of https://docs.slack.dev/reference/block-kit/blocks
and https://docs.slack.dev/reference/block-kit/blocks/table-block). The fleet summary shares
the message renderer with ``use_table=False``: the same rows as preformatted section text.

Where sweeps run, the tab also says how many GPU-hours the viewer holds idle (GPUs at 0 % for
``[sweep] idle_hours`` while their processes keep memory on them), and the same for the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpubot.chat.blocks import (
    MAX_VIEW_BLOCKS,
    Budget,
    code,
    code_safe,
    context,
    date,
    escape,
    header,
    section,
)
from gpubot.chat.fleet_view import proc_label, render_fleet
from gpubot.chat.interrupted import Interrupted, interrupted_blocks
from gpubot.core.models import NodeSnapshot


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
) -> dict[str, Any]:
    """Render the Home tab view for ``user_id`` (at most 100 blocks, no table block).

    ``idle_hours``: GPU-hours held idle per Linux user (None: not known here).
    ``interrupted``: actions gpubot never recorded an end of, shown first until reviewed.
    """
    b = Budget(MAX_VIEW_BLOCKS)
    b.add(header("GPU fleet"))
    for blk in interrupted_blocks(interrupted, buttons=True):
        b.add(blk)
    if linux_user is None:
        b.add(
            section(
                f"Hello <@{user_id}>. Your Slack account is not mapped to a Linux user, so every "
                "reset you ask for needs on-call approval. Ask an admin to add you to `[users]`."
            )
        )
    else:
        mine = [(s.node, p) for s in snapshots for p in s.processes if p.user == linux_user]
        b.add(section(f"*Your processes* (Linux user {code(linux_user)}): {len(mine)}"))
        lines = [code_safe(f"{node} GPU {p.gpu_index}: {proc_label(p)}") for node, p in mine]
        shown = b.add_pre(lines[:200], reserve=40) if lines else 0
        if shown < len(mine):
            b.add(context(f"… and {len(mine) - shown} more"))
        held = (idle_hours or {}).get(linux_user)
        if held:
            b.add(
                section(
                    f"⏳ *You hold GPUs idle: {held:.1f} GPU-hours so far.* "
                    "Your processes keep memory on GPUs that have been at 0 % for hours; "
                    "free them with `/gpu reset NODE gpu N pid P`, "
                    "or *Free it* in my direct message."
                )
            )
    if idle_hours:
        top = list(idle_hours.items())[:MAX_IDLE_USERS]
        more = len(idle_hours) - len(top)
        held_by = " · ".join(f"{escape(u)} {h:.1f}" for u, h in top)
        b.add(context(f"GPU-hours held idle: {held_by}" + (f" · and {more} more" if more else "")))
    fleet = render_fleet(
        snapshots, failed, seconds=seconds, title="Fleet", use_table=False, limit=b.room - 1
    )
    for blk in fleet["blocks"]:
        b.add(blk)
    b.add(context(f"refreshed {date(now)} · type `/gpu help` in any channel"))
    return {"type": "home", "blocks": b.blocks}


MAX_IDLE_USERS = 20  # owners named in the fleet's idle line (most GPU-hours first)


def render_refused_home(user_id: str, reason: str, *, now: float) -> dict[str, Any]:
    """Render the Home tab for an account gpubot refuses (no fleet data is shown)."""
    return {
        "type": "home",
        "blocks": [
            header("GPU fleet"),
            section(f"Hello <@{user_id}>. ⛔ {escape(reason)}."),
            context(f"checked {date(now)}"),
        ],
    }
