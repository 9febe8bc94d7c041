"""The direct message to an idle holder's owner, and its "Free it" button.

When a sweep alerts on idle holders (``core.idle``), each owner whose Linux user maps to Slack
users (``[users]``) gets one direct message listing their idle GPUs, each with *Free it* and
*Snooze 1 day*. *Free it* is the clicker's own ``/gpu reset NODE gpu N pid P``: the usual
identity, permission and approval rules decide, so someone else's process still needs on-call.
Before that, the process is looked up again: a pid that ended or was reused since the alert is
never reset on the alert's word.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpubot.chat.blocks import escape, render_text
from gpubot.chat.flows import error_message
from gpubot.chat.idle import ACTION_FREE
from gpubot.core import commands
from gpubot.core.findings import FindingKey
from gpubot.errors import GpubotError, UsageError
from gpubot.services.status import StatusService

if TYPE_CHECKING:
    from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)


def register(bot: GpuBot, status: StatusService) -> None:
    """Handle the "Free it" buttons of idle-holder messages in ``bot``."""

    async def on_free(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user = body.get("user") or {}
        bot.spawn(
            _free(
                bot,
                status,
                body,
                str(action.get("value")),
                str(user.get("id", "")),
                str(user.get("username") or ""),
            ),
            "free it",
        )

    bot.app.action(ACTION_FREE)(on_free)


async def _free(
    bot: GpuBot, status: StatusService, body: dict[str, Any], value: str, user: str, name: str
) -> None:
    out = bot.surface(body)
    try:
        key = FindingKey.parse(value)
        pid_text, _, ticks = key.holder.partition(":")
        if key.gpu is None or not pid_text.isdigit() or not ticks.isdigit():
            raise UsageError("this button names no process to free")
        pid = int(pid_text)
        line = f"reset {key.node} gpu {key.gpu} pid {pid}"
        cmd = commands.parse(line)
        who = await bot.identify(user, name)
        if who.refused is None:
            snap = await status.snapshot(status.node(key.node))
            if not any(
                p.pid == pid and p.start_ticks == int(ticks) and p.gpu_index == key.gpu
                for p in snap.processes
            ):
                await out.reply(
                    render_text(
                        f"✅ pid {pid} no longer holds {escape(key.node)} GPU {key.gpu} (it ended, "
                        "or the pid is another process now): nothing to free."
                    )
                )
                return
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    await bot.flows.run(cmd, who, out, text=f"/gpu {line} (Free it)")
