"""The direct message to an idle holder's owner, and its "Free it" button.

When a sweep alerts on idle holders (``core.usage.idle``), each owner whose Linux user maps to Slack
users (``[users]``) gets one direct message listing their idle GPUs, each with *Free it* and
*Snooze 1 day*. A click runs the shared flow (``chat.holders.free_it``), as the console's
``free`` does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpubot.chat.holders import free_it
from gpubot.chat.idle import ACTION_FREE

if TYPE_CHECKING:
    from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)


def register(bot: GpuBot) -> None:
    """Handle the "Free it" buttons of idle-holder messages in ``bot``."""

    async def on_free(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        bot.spawn(_free(bot, body, str(action.get("value"))), "free it")

    bot.app.action(ACTION_FREE)(on_free)


async def _free(bot: GpuBot, body: dict[str, Any], value: str) -> None:
    out = bot.surface(body)
    who = await bot.clicker(body, out)
    if who is not None:
        await free_it(bot.flows, value, who, out)
