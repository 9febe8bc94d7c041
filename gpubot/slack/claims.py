"""The claim and queue buttons (Claim, Leave, Queue me) on Slack: a click runs the shared flow
(``chat.claims.ClaimDesk.click``), as ``/gpu take ID`` does. The duty's DMs: ``slack.front``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpubot.chat import claim_view as view

if TYPE_CHECKING:
    from gpubot.core.policy import Person
    from gpubot.slack.app import GpuBot
    from gpubot.slack.render import NeutralSurface

ACTIONS = (
    view.ACTION_TAKE,
    view.ACTION_LEAVE,
    view.ACTION_JOIN,
    view.ACTION_KEEP,
    view.ACTION_RELEASE,
    view.ACTION_FREE_INTRUDER,
)


def register(bot: GpuBot) -> None:

    async def click(who: Person, out: NeutralSurface, action: dict[str, Any]) -> None:
        kind, value = str(action.get("action_id")), str(action.get("value"))
        if kind == view.ACTION_FREE_INTRUDER:
            await bot.flows.claims.free_intruder(value, who, out)
        else:
            await bot.flows.claims.click(kind, value, who, out)

    for action_id in ACTIONS:
        bot.on_click(action_id, "claim button", click)
