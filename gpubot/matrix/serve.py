"""The Matrix front end at run time: check the login, then sync until told to stop.

``gpubot.cli.serve`` builds the app on ``matrix.front.MatrixFront`` and runs its lifecycle
(``App.running``); this module checks who the token is (``check_login``) and runs the bot's long
poll (``listen``).
"""

from __future__ import annotations

import asyncio
import sys

from gpubot.errors import ChatCallFailed, ChatUnanswered, ConfigError
from gpubot.matrix.api import MatrixApi
from gpubot.matrix.bot import MatrixBot


async def check_login(api: MatrixApi, token_env: str) -> None:
    """Ask the homeserver who the token is: refused, or another user than ``[matrix] user_id``,
    is a start-up error in one line; a homeserver that cannot be reached is one too (the bot
    would answer nobody)."""
    access = api.access
    try:
        me = await api.whoami()
    except ChatUnanswered as exc:
        raise ConfigError(
            f"matrix.homeserver {access.homeserver}: no answer ({exc.error})"
        ) from None
    except ChatCallFailed as exc:
        if exc.error in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN"):
            raise ConfigError(f"{token_env} was refused by the homeserver: {exc.error}") from None
        raise ConfigError(f"matrix.homeserver {access.homeserver}: {exc.error}") from None
    if me.get("user_id") != access.user_id:
        raise ConfigError(
            f"{token_env} is {me.get('user_id')!r}'s token, not matrix.user_id {access.user_id!r}"
        )
    if me.get("device_id") not in (None, access.device_id):
        raise ConfigError(
            f"{token_env} belongs to device {me.get('device_id')!r}, not matrix.device_id "
            f"{access.device_id!r}: log in with that device id, so a resent post stays one event"
        )


async def listen(bot: MatrixBot, stop: asyncio.Event) -> None:
    """Sync until ``stop`` is set (the entry sets it on SIGTERM or SIGINT), then let the
    commands under way finish."""
    running = asyncio.create_task(bot.run(stop))
    ready = asyncio.create_task(bot.ready.wait())
    await asyncio.wait({running, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():  # the first sync is behind: what is typed now is answered
        print(f"gpubot: serving Matrix as {bot.me}", file=sys.stderr, flush=True)
    ready.cancel()
    await running
    await bot.drain()
