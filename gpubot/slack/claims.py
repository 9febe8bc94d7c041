"""Claims and the queue on Slack: the buttons (Claim, Leave, Queue me) and the DMs.

A click runs the shared flow (``chat.claims.ClaimDesk.click``), as ``/gpu take ID`` does. Each
DM is posted once through the one outbox, one row per subject whichever process finds it due (a
hold the CLI recorded is told by the bot's duty); a DM that cannot be sent is logged, and a
hold's is tried again on the duty's next turn while the hold lasts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpubot.chat import claim_view as view

if TYPE_CHECKING:
    from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)
ACTIONS = (
    view.ACTION_TAKE,
    view.ACTION_LEAVE,
    view.ACTION_JOIN,
    view.ACTION_KEEP,
    view.ACTION_RELEASE,
    view.ACTION_FREE_INTRUDER,
)


def register(bot: GpuBot) -> None:
    """Handle the claim and queue buttons in ``bot`` (the duty's DMs: ``slack.front``)."""

    async def on_click(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        bot.spawn(
            _click(bot, body, str(action.get("action_id")), str(action.get("value"))),
            "claim button",
        )

    for action_id in ACTIONS:
        bot.app.action(action_id)(on_click)


async def _click(bot: GpuBot, body: dict[str, Any], action: str, value: str) -> None:
    out = bot.surface(body)
    who = await bot.clicker(body, out)
    if who is None:
        return
    if action == view.ACTION_FREE_INTRUDER:
        await bot.flows.claims.free_intruder(value, who, out)
    else:
        await bot.flows.claims.click(action, value, who, out)
