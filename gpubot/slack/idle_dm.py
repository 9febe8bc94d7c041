"""The direct message to an idle holder's owner, and its "Free it" button.

Each owner of idle holders whose Linux user maps to Slack users (``[users]``) gets one DM
listing their idle GPUs (``slack.alerts``). *Free it* runs the shared flow
(``chat.holders.free_it``), as the console's ``free`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpubot.chat.holders import free_it
from gpubot.chat.idle import ACTION_FREE

if TYPE_CHECKING:
    from gpubot.core.policy import Person
    from gpubot.slack.app import GpuBot
    from gpubot.slack.render import NeutralSurface


def register(bot: GpuBot) -> None:
    async def free(who: Person, out: NeutralSurface, action: dict[str, Any]) -> None:
        await free_it(bot.flows, str(action.get("value")), who, out)

    bot.on_click(ACTION_FREE, "free it", free)
