"""The Slack front end at run time: the bolt app over HTTP or Socket Mode, until stopped.

``gpubot.cli.serve`` reads the arguments and secrets and calls ``gpubot.app.build``; this module
puts the bolt handlers on the built ``App`` (``GpuBot`` and each family's ``register``), checks
the token, reports what a previous run left unfinished, starts the schedules and the metrics,
and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_sdk.errors import SlackApiError, SlackClientError

from gpubot.app import App
from gpubot.chat.message import Message, Section, paragraph
from gpubot.chat.surface import MIN_UPDATE_S
from gpubot.errors import ConfigError
from gpubot.slack import alerts, dump, idle_dm
from gpubot.slack.app import GpuBot
from gpubot.store import Approval, Store

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


def build_bot(
    app: App, signing_secret: str | None, *, min_update_s: float = MIN_UPDATE_S
) -> GpuBot:
    """Put the Slack front end on ``app``: the bolt handlers of every family.

    ``signing_secret`` None: Socket Mode. ``min_update_s``: the least time between two progress
    edits of one message (tests pass a small value; see ``flows.MIN_UPDATE_S``).
    """
    if app.slack is None:
        raise ConfigError("the app was built without Slack (build(..., slack=...))")
    bot = GpuBot(app.chat, app.slack, signing_secret=signing_secret, min_update_s=min_update_s)
    for family in (alerts, idle_dm):
        family.register(bot, app)
    return bot


async def start_http(bot: GpuBot, host: str, port: int, path: str) -> web.AppRunner:
    """Serve Slack's requests at ``http://host:port/path``; return the runner to clean up."""
    runner = web.AppRunner(bot.web_app(path), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def start_metrics(app: App, port: int | None, host: str | None = None) -> int | None:
    """Serve the metrics on ``port`` (``--metrics-port``), else ``[metrics] port``, if either,
    at ``host`` (``--metrics-host``), else ``[metrics] host``; return the bound port."""
    port = app.settings.metrics.port if port is None else port
    host = host or app.settings.metrics.host
    if port is None or app.metrics is None:
        return None
    bound = app.metrics.serve(port, host)
    log.info("metrics at http://%s:%d/metrics", host, bound)
    return bound


async def serve_forever(
    app: App,
    listen: Listener,
    *,
    metrics_port: int | None,
    metrics_host: str | None = None,
    sweeps: bool,
    expire_every_s: float,
) -> None:
    """Run the Slack front end on ``app`` until SIGTERM or SIGINT."""
    bot = build_bot(app, listen.signing_secret if listen.http else None)
    await _check_token(bot)
    if app.store is not None:
        await report_incomplete(app.store, bot)
    start_metrics(app, metrics_port, metrics_host)
    settle_heap()
    app.start(sweeps=sweeps)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    dump.install(loop)  # kill -USR1: log what every task and thread is waiting on
    expiry = asyncio.create_task(bot.expire_forever(expire_every_s), name="expire approvals")
    # How long anything holds the loop, from here on (gpubot_event_loop_max_stall_seconds).
    watch = asyncio.create_task(app.metrics.watch_loop()) if app.metrics is not None else None
    if listen.http:
        runner = await start_http(bot, listen.host, listen.port, listen.path)
        print(
            f"gpubot: serving Slack at http://{listen.host}:{listen.port}{listen.path}",
            file=sys.stderr,
        )
        await stop.wait()
        await runner.cleanup()
    else:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        handler: Any = AsyncSocketModeHandler(bot.app, listen.app_token, web_client=bot.client)
        await handler.connect_async()
        print("gpubot: connected to Slack (Socket Mode)", file=sys.stderr)
        await stop.wait()
        await handler.close_async()
    for task in (expiry, watch):
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    await bot.drain()
    dump.uninstall(loop)


def settle_heap() -> None:
    """Keep what start-up made (modules, settings, the bolt app: alive as long as the process)
    out of the garbage collector's full passes from now on.

    Each full pass walks every tracked object with the event loop held. Measured in-process
    (the bot, its fake Slack and sender in one process; CPU time per loop callback) while it
    answered 100 ``/gpu status all`` over 64 nodes: one full pass took 67-87 ms of CPU, the only
    callback over 10 ms; with what existed before the burst frozen, 26 ms.
    """
    gc.collect()
    gc.freeze()


async def report_incomplete(store: Store, bot: GpuBot) -> None:
    """Say, at start-up, which actions have no outcome and which approved forced kills never
    ended (a bot died while running them); mark those approvals ``incomplete``."""
    left = await store.incomplete_actions()
    if left:
        await _post_list(
            bot,
            "Incomplete actions",
            [
                f"• #{a.id} {a.kind} on {a.node or '-'} by {a.actor}, started "
                f"{a.started_at:%Y-%m-%d %H:%M:%S} UTC: `{a.command}`"
                for a in left
            ],
            f"{len(left)} action(s) never recorded an outcome (gpubot stopped while running "
            "them); check those nodes",
            " (`gpubot audit list`)",
        )
    if bot.services.approvals is not None:
        marked = await bot.services.approvals.abandon_approved()
        if marked:
            await _post_list(
                bot,
                "Incomplete approvals",
                [_approval_line(a) for a in marked],
                f"{len(marked)} approved forced kill(s) never recorded an end "
                "(gpubot stopped while running them), now marked incomplete; "
                "check those nodes",
                "",
            )


def _approval_line(a: Approval) -> str:
    at = "" if a.decided_at is None else f" at {a.decided_at:%Y-%m-%d %H:%M:%S} UTC"
    command = a.plan.get("command", "") if isinstance(a.plan, dict) else ""
    return (
        f"• approval #{a.id} on {a.node}: asked by {a.requester_name or a.requester} "
        f"({a.requester}), approved by {a.decided_by_name or a.decided_by} ({a.decided_by})"
        f"{at}: `{command}`"
    )


async def _post_list(bot: GpuBot, title: str, lines: list[str], head: str, more: str) -> None:
    """Log ``head`` with at most ten of ``lines`` and post it to the alerts channel."""
    shown = lines[:10] + ([f"… and {len(lines) - 10} more{more}"] if len(lines) > 10 else [])
    text = head + ":\n" + "\n".join(shown)
    log.warning("%s", text.replace("\n", " "))
    await bot.post_alert(None, Message(title, (Section(paragraph(text)),)))


async def _check_token(bot: GpuBot) -> None:
    """Ask Slack who we are: a refused token is a start-up error naming the variable."""
    try:
        await bot.client.auth_test()
    except SlackApiError as exc:
        raise ConfigError(
            f"SLACK_BOT_TOKEN was refused by Slack: {exc.response.get('error')}"
        ) from None
    except SlackClientError as exc:
        log.warning("cannot reach the Slack Web API yet: %s", exc)
