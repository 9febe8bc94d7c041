"""The direct message an idle holder's owner gets: what is held idle, *Free it* and *Snooze*."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpubot.chat.blocks import (
    MAX_FALLBACK,
    Budget,
    Message,
    clip,
    clip_mrkdwn,
    code,
    confirm_dialog,
    context,
    date,
    escape,
    mrkdwn,
    section,
)
from gpubot.core.alerting import AlertItem, Handle
from gpubot.core.findings import duration_text

ACTION_FREE = "gpubot_free_it"  # the value is the finding's key text
MAX_DM_ITEMS = 10  # idle GPUs detailed in one message (2 blocks each)


def slack_users_of(users: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Return Linux user → the Slack user ids ``[users]`` maps to it (sorted)."""
    out: dict[str, list[str]] = {}
    for slack_id, linux in users.items():
        out.setdefault(linux, []).append(slack_id)
    return {linux: tuple(sorted(ids)) for linux, ids in out.items()}


def free_button(key_text: str, node: str, gpu: int, pid: str) -> dict[str, Any]:
    """Return the "Free it" button of one idle holder (confirmed before anything happens)."""
    return {
        "type": "button",
        "action_id": ACTION_FREE,
        "value": key_text,
        "style": "danger",
        "text": {"type": "plain_text", "text": "Free it"},
        # plain_text throughout, raw (not escaped): see blocks.confirm_dialog
        "confirm": confirm_dialog(
            f"Free {node} GPU {gpu}?",
            f"pid {pid} gets SIGTERM, then SIGKILL if it has not ended after the grace period.",
            confirm="Free it",
            deny="Cancel",
            style="danger",
        ),
    }


def render_idle_dm(
    items: Sequence[AlertItem],
    node: str,
    *,
    now: datetime,
    alert: Handle | None,
    snooze: Callable[[str], dict[str, Any]],
) -> Message:
    """Render the direct message to one owner about their idle holders on ``node``."""
    found = [i for i in items if i.finding is not None and i.key.gpu is not None]
    hours = max((i.finding.idle_s or 0.0 for i in found if i.finding is not None), default=0.0)
    gpus = ", ".join(f"GPU {i.key.gpu}" for i in found)
    title = f"Your job holds {node} {gpus} idle ({duration_text(hours)} at 0 %)"
    b = Budget()
    b.add(
        section(
            f"👋 *{escape(title)}*\nOthers are waiting for GPUs. If you are done, *Free it* stops "
            "the process (your own reset: SIGTERM, then SIGKILL after the grace period). Not done "
            "yet? *Snooze 1 day*."
        )
    )
    for item in found[:MAX_DM_ITEMS]:
        f = item.finding
        assert f is not None and item.key.gpu is not None
        lines = [f"*{escape(node)} GPU {item.key.gpu}*: {clip_mrkdwn(mrkdwn(f.summary), 800)}"]
        if f.owner:
            job = f" · workload: {clip_mrkdwn(code(f.workload), 200)}" if f.workload else ""
            lines.append(f"owner: {code(f.owner)}{job}")
        b.add(section("\n".join(lines)))
        pid = item.key.holder.split(":", 1)[0]
        free = free_button(item.key.text(), node, item.key.gpu, pid)
        b.add({"type": "actions", "elements": [free, snooze(item.key.text())]})
    if len(found) > MAX_DM_ITEMS:
        b.add(context(f"… and {len(found) - MAX_DM_ITEMS} more idle GPU(s) on {escape(node)}"))
    where = f" · also in <#{alert[0]}>" if alert is not None else ""
    b.add(context(f"gpubot sweep · {date(now.timestamp())}{where}"))
    return {"text": escape(clip(title, MAX_FALLBACK)), "blocks": b.blocks}
