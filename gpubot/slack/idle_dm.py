"""The direct message to an idle holder's owner, and its "Free it" button.

When a sweep alerts on idle holders (``core.usage.idle``), each owner whose Linux user maps to Slack
users (``[users]``) gets one direct message listing their idle GPUs, each with *Free it* and
*Snooze 1 day*. A click runs the shared flow (``chat.holders.free_it``), as the console's
``free`` does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpubot.chat.flows import error_message
from gpubot.chat.holders import free_it
from gpubot.chat.idle import ACTION_FREE
from gpubot.errors import GpubotError

if TYPE_CHECKING:
    from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)


def register(bot: GpuBot) -> None:
    """Handle the "Free it" buttons of idle-holder messages in ``bot``."""

    async def on_free(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user = body.get("user") or {}
        bot.spawn(
            _free(
                bot,
                body,
                str(action.get("value")),
                str(user.get("id", "")),
                str(user.get("username") or ""),
            ),
            "free it",
        )

    bot.app.action(ACTION_FREE)(on_free)


async def _free(bot: GpuBot, body: dict[str, Any], value: str, user: str, name: str) -> None:
    out = bot.surface(body)
    try:
        who = await bot.identify(user, name)
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    await free_it(bot.flows, value, who, out)
