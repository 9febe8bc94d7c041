"""``gpubot serve``: run the Slack bot, over Socket Mode (default) or HTTP (``--http``).

The only place that reads Slack secrets, from the environment: ``SLACK_BOT_TOKEN`` (always),
``SLACK_APP_TOKEN`` (Socket Mode), ``SLACK_SIGNING_SECRET`` (HTTP), ``SLACK_API_URL`` (optional:
another Web API host, e.g. Slack's government cloud, or a test fake).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_sdk.errors import SlackApiError, SlackClientError

from gpubot.app import App, build, settings_from
from gpubot.chat.blocks import render_text
from gpubot.chat.flows import MIN_UPDATE_S, make_services
from gpubot.config import Settings
from gpubot.errors import ConfigError
from gpubot.slack.alerts import start_sweeps
from gpubot.slack.api import SlackDirectory, make_client
from gpubot.slack.app import GpuBot
from gpubot.slack.heads import start_head_publication
from gpubot.store import Approval, Store

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://slack.com/api/"
_BOT = re.compile(r"xoxb-[A-Za-z0-9-]{8,}")
_APP = re.compile(r"xapp-[A-Za-z0-9-]{8,}")
_SECRET = re.compile(r"[0-9a-fA-F]{16,128}")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


@dataclass(frozen=True)
class Tokens:
    """Slack credentials and where the Web API is."""

    bot: str
    app: str | None
    signing_secret: str | None
    api_url: str


def read_tokens(environ: Mapping[str, str], *, http: bool) -> Tokens:
    """Read and check the Slack variables; raise ``ConfigError`` naming the first bad one."""

    def need(name: str, pattern: re.Pattern[str], what: str) -> str:
        value = environ.get(name, "").strip()
        if not value:
            raise ConfigError(f"{name} is not set: {what}")
        if not pattern.fullmatch(value):
            raise ConfigError(f"{name} is malformed: expected {what}")
        return value

    bot = need("SLACK_BOT_TOKEN", _BOT, "the bot token (xoxb-…) from OAuth & Permissions")
    app = secret = None
    if http:
        secret = need("SLACK_SIGNING_SECRET", _SECRET,
                      "the signing secret (hex) from Basic Information")  # fmt: skip
    else:
        app = need("SLACK_APP_TOKEN", _APP, "an app-level token (xapp-…) for Socket Mode")
    url = environ.get("SLACK_API_URL", "").strip() or DEFAULT_API_URL
    if not _URL.fullmatch(url):
        raise ConfigError(f"SLACK_API_URL is malformed: expected http(s)://host/path/, got {url!r}")
    return Tokens(bot, app, secret, url if url.endswith("/") else url + "/")


def build_bot(
    settings: Settings,
    app: App,
    tokens: Tokens,
    *,
    http: bool,
    min_update_s: float = MIN_UPDATE_S,
) -> GpuBot:
    """Wire the Slack front end over the services of ``app``.

    ``min_update_s``: the least time between two progress edits of one message (tests pass a
    small value; see ``flows.MIN_UPDATE_S``).
    """
    client = make_client(tokens.bot, tokens.api_url)
    services = make_services(settings, app.status, app.reset, app.store, SlackDirectory(client))
    return GpuBot(services, client, signing_secret=tokens.signing_secret if http else None,
                  min_update_s=min_update_s)  # fmt: skip


async def start_http(bot: GpuBot, host: str, port: int, path: str) -> web.AppRunner:
    """Serve Slack's requests at ``http://host:port/path``; return the runner to clean up."""
    runner = web.AppRunner(bot.web_app(path), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``gpubot serve`` options."""
    parser.add_argument("--http", action="store_true",
                        help="serve the Events API over HTTP instead of Socket Mode")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1",
                        help="HTTP: address to listen on (default 127.0.0.1)")  # fmt: skip
    parser.add_argument("--port", type=int, default=3000, help="HTTP: port (default 3000)")
    parser.add_argument("--path", default="/slack/events",
                        help="HTTP: request path (default /slack/events)")  # fmt: skip
    parser.add_argument("--expire-every", type=float, default=30.0, metavar="S",
                        help="check approvals for expiry every S seconds (default 30)")  # fmt: skip
    parser.add_argument("--metrics-port", type=int, metavar="P",
                        help="serve Prometheus metrics on port P ([metrics] port)")  # fmt: skip
    parser.add_argument("--no-sweeps", action="store_true",
                        help="do not run scheduled sweeps in this process")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the bot until interrupted."""
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a port number (1-65535)")
    if not args.path.startswith("/"):
        raise ConfigError(f"--path {args.path!r}: must start with /")
    if not args.expire_every > 0:
        raise ConfigError(f"--expire-every {args.expire_every}: must be > 0 seconds")
    environ = os.environ
    tokens = read_tokens(environ, http=args.http)
    settings = settings_from(args.config, environ)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_serve(args, settings, tokens, environ))
    return 0


async def _serve(
    args: argparse.Namespace, settings: Settings, tokens: Tokens, environ: Mapping[str, str]
) -> None:
    app = build(settings, environ, need_store=True)  # a database that is behind stops us here
    sweeps = None
    heads = None
    try:
        bot = build_bot(settings, app, tokens, http=args.http)
        await _check_token(bot)
        if app.store is not None:
            await report_incomplete(app.store, bot)
        sweeps = await start_sweeps(
            settings, app, bot, metrics_port=args.metrics_port, schedule=not args.no_sweeps
        )
        heads = await start_head_publication(settings, app, bot)  # [audit] publish_head_every
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        expiry = asyncio.create_task(bot.expire_forever(args.expire_every))
        if args.http:
            runner = await start_http(bot, args.host, args.port, args.path)
            print(f"gpubot: serving Slack at http://{args.host}:{args.port}{args.path}",
                  file=sys.stderr)  # fmt: skip
            await stop.wait()
            await runner.cleanup()
        else:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            handler: Any = AsyncSocketModeHandler(bot.app, tokens.app, web_client=bot.client)
            await handler.connect_async()
            print("gpubot: connected to Slack (Socket Mode)", file=sys.stderr)
            await stop.wait()
            await handler.close_async()
        expiry.cancel()
        with suppress(asyncio.CancelledError):
            await expiry
        await bot.drain()
    finally:
        if heads is not None:
            await heads.stop()
        if sweeps is not None:
            await sweeps.stop()
        await app.close()


async def report_incomplete(store: Store, bot: GpuBot) -> None:
    """Say, at start-up, which actions have no outcome and which approved forced kills never
    ended (a bot died while running them); mark those approvals ``incomplete``."""
    left = await store.incomplete_actions()
    if left:
        await _post_list(bot, "Incomplete actions", [
            f"• #{a.id} {a.kind} on {a.node or '-'} by {a.actor}, started "
            f"{a.started_at:%Y-%m-%d %H:%M:%S} UTC: `{a.command}`" for a in left
        ], f"{len(left)} action(s) never recorded an outcome (gpubot stopped while running "
           "them); check those nodes", " (`gpubot audit list`)")  # fmt: skip
    if bot.services.approvals is not None:
        marked = await bot.services.approvals.abandon_approved()
        if marked:
            await _post_list(bot, "Incomplete approvals", [_approval_line(a) for a in marked],
                             f"{len(marked)} approved forced kill(s) never recorded an end "
                             "(gpubot stopped while running them), now marked incomplete; "
                             "check those nodes", "")  # fmt: skip


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
    await bot.post_alert(None, render_text(text, title=title))


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
