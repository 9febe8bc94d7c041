"""The Slack front end at run time: the bolt app over HTTP or Socket Mode, until stopped.

``gpubot.cli.serve`` builds the app on ``slack.front.SlackFront`` and runs its lifecycle
(``App.running``); this module only puts the bolt handlers on the narrow parts it is given
(``build_bot``), checks the token and listens for Slack until SIGTERM or SIGINT (``listen``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpubot.chat.flows import Flows
from gpubot.errors import ChatCallFailed, ConfigError
from gpubot.services.alert_keeper import Snoozer
from gpubot.slack import alerts, claims, dump, idle_dm, ladder
from gpubot.slack.api import SlackApi, answered, call
from gpubot.slack.app import GpuBot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listener:
    """How Slack reaches the bot: HTTP (``host:port/path``, signed) or Socket Mode."""

    http: bool
    host: str = "127.0.0.1"
    port: int = 3000
    path: str = "/slack/events"
    app_token: str | None = None  # Socket Mode
    signing_secret: str | None = None  # HTTP


@dataclass(frozen=True)
class SlackParts:
    """What the Slack front end is given: its flows, the Web API adapter and what the snooze
    buttons call."""

    flows: Flows
    api: SlackApi
    snoozer: Snoozer


def build_bot(parts: SlackParts, signing_secret: str | None) -> GpuBot:
    """Put the bolt handlers of every family on ``parts``; ``signing_secret`` None: Socket Mode."""
    bot = GpuBot(parts.flows, parts.api, signing_secret=signing_secret)
    alerts.register(bot, parts.snoozer)
    idle_dm.register(bot)
    ladder.register(bot)
    claims.register(bot)
    return bot


async def start_http(bot: GpuBot, host: str, port: int, path: str) -> web.AppRunner:
    """Serve Slack's requests at ``http://host:port/path``; return the runner to clean up. A
    port that cannot be bound is a ``ConfigError``: one line naming the flag, never a traceback.
    """
    runner = web.AppRunner(bot.web_app(path), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot serve Slack on {host}:{port}: {exc.strerror or exc}: choose another "
            "--port (and the Slack app's Request URL with it) or stop what holds it"
        ) from None
    return runner


async def listen(bot: GpuBot, listener: Listener, stop: asyncio.Event) -> None:
    """Listen for Slack until ``stop`` is set (the entry sets it on SIGTERM or SIGINT), then
    let the handlers under way finish. SIGUSR1 dumps what every task waits on."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, dump.dump, loop)
    try:
        if listener.http:
            runner = await start_http(bot, listener.host, listener.port, listener.path)
            where = f"http://{listener.host}:{listener.port}{listener.path}"
            print(f"gpubot: serving Slack at {where}", file=sys.stderr)
            await stop.wait()
            await runner.cleanup()
        else:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            handler: Any = AsyncSocketModeHandler(
                bot.app, listener.app_token, web_client=bot.client
            )
            await _connect_until(handler, stop)
            await handler.close_async()
        await bot.drain()
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)


async def _connect_until(handler: Any, stop: asyncio.Event) -> None:
    """Connect in Socket Mode (bolt retries a Slack it cannot reach), then wait for ``stop``; a
    stop while it is still trying ends the try, so SIGTERM and SIGINT always end the bot."""
    connecting = asyncio.ensure_future(handler.connect_async())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        return
    connecting.result()
    print("gpubot: connected to Slack (Socket Mode)", file=sys.stderr)
    await stopping


async def check_token(api: SlackApi) -> None:
    """Ask Slack who we are: a refused token is a start-up error naming the variable; a Slack
    that cannot be reached is one line, and the bot starts (calls retry; Socket Mode reconnects)."""
    try:
        await call(api.client, "auth.test")
    except ChatCallFailed as exc:
        if not answered(exc):
            log.warning("cannot reach the Slack Web API yet (%s): starting anyway", exc.error)
            return
        raise ConfigError(f"SLACK_BOT_TOKEN was refused by Slack: {exc.error}") from None
