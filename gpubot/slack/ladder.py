"""The reclaim ladder's buttons in Slack: *Keep (reason)* and on-call's *Free it*.

The steps themselves are told by ``chat.ladder.LadderTeller``, which the root builds. *Keep
(reason)* opens a modal asking why; its submission stops the ladder (audited with the reason).
On-call's *Free it* asks the approvers for a forced reset of that one process, the request
carrying the idle evidence.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from gpubot.chat.ladder import (
    ACTION_KEEP,
    ACTION_ONCALL_FREE,
    keep,
    oncall_free,
)
from gpubot.errors import ChatCallFailed
from gpubot.slack.api import call

if TYPE_CHECKING:
    from gpubot.core.policy import Person
    from gpubot.slack.app import GpuBot
    from gpubot.slack.render import NeutralSurface

log = logging.getLogger(__name__)

KEEP_VIEW = "gpubot_ladder_keep_view"  # the modal's callback id
REASON_BLOCK, REASON_INPUT = "reason", "reason_input"


def keep_view(key: str, where: str) -> dict[str, Any]:
    """Return the modal asking why the GPU ``where`` is kept."""
    return {
        "type": "modal",
        "callback_id": KEEP_VIEW,
        "private_metadata": key,
        "title": {"type": "plain_text", "text": "Keep the GPU"},
        "submit": {"type": "plain_text", "text": "Keep"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "label": {"type": "plain_text", "text": f"Why do you still need {where}?"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_INPUT,
                    "max_length": 300,
                },
            }
        ],
    }


def register(bot: GpuBot) -> None:
    """Handle *Keep (reason)*, its modal, and on-call's *Free it*."""

    async def on_keep(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        bot.spawn(_open_keep(bot, body, str(action.get("value"))), "keep")

    async def on_keep_view(ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        await ack()
        state = ((view.get("state") or {}).get("values") or {}).get(REASON_BLOCK) or {}
        reason = str((state.get(REASON_INPUT) or {}).get("value") or "")
        bot.spawn(_keep(bot, body, str(view.get("private_metadata")), reason), "keep reason")

    async def free(who: Person, out: NeutralSurface, action: dict[str, Any]) -> None:
        if bot.services.ladder is not None:
            await oncall_free(bot.flows, bot.services.ladder, str(action.get("value")), who, out)

    bot.app.action(ACTION_KEEP)(on_keep)
    bot.app.view(KEEP_VIEW)(on_keep_view)
    bot.on_click(ACTION_ONCALL_FREE, "on-call free it", free)


async def _open_keep(bot: GpuBot, body: dict[str, Any], key: str) -> None:
    try:
        node, gpu, *_ = json.loads(key)
        where = f"{node} GPU {gpu}"
    except (ValueError, TypeError):
        where = "this GPU"
    try:
        await call(
            bot.client, "views.open", trigger_id=body.get("trigger_id"), view=keep_view(key, where)
        )
    except ChatCallFailed as exc:
        log.warning("the Keep modal did not open: %s", exc.error)


async def _keep(bot: GpuBot, body: dict[str, Any], key: str, reason: str) -> None:
    """The modal's submission: keep, and answer in the owner's DM (a view has no channel)."""
    ladder = bot.services.ladder
    dm = await bot.api.open_dm(str((body.get("user") or {}).get("id", "")))
    out = bot.surface({**body, "channel": {"id": dm}} if dm else body)
    who = await bot.clicker(body, out)
    if who is not None and ladder is not None:
        await keep(ladder, key, reason, who, out, source="slack")
