"""``gpubot serve``: run the Slack bot, over Socket Mode (default) or HTTP (``--http``), or the
Matrix bot (``--chat matrix``). One front end per process: to serve both, run one ``gpubot
serve`` for each on one database (each one's approval duty handles its own requests), the
second with ``--no-sweeps`` (``SERVE_BOTH``).

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpubot.app import Serving, build, settings_from
from gpubot.cli.common import duration_arg
from gpubot.config import Settings, check_port
from gpubot.errors import ConfigError

if TYPE_CHECKING:
    from gpubot.matrix.settings import MatrixSettings

DEFAULT_API_URL = "https://slack.com/api/"
_BOT = re.compile(r"xoxb-[A-Za-z0-9-]{8,}")
_APP = re.compile(r"xapp-[A-Za-z0-9-]{8,}")
_SECRET = re.compile(r"[0-9a-fA-F]{16,128}")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


@dataclass(frozen=True)
class Tokens:
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
        secret = need(
            "SLACK_SIGNING_SECRET", _SECRET, "the signing secret (hex) from Basic Information"
        )
    else:
        app = need("SLACK_APP_TOKEN", _APP, "an app-level token (xapp-…) for Socket Mode")
    url = environ.get("SLACK_API_URL", "").strip() or DEFAULT_API_URL
    if not _URL.fullmatch(url):
        raise ConfigError(f"SLACK_API_URL is malformed: expected http(s)://host/path/, got {url!r}")
    return Tokens(bot, app, secret, url if url.endswith("/") else url + "/")


CHATS = ("slack", "matrix")
SERVE_BOTH = (
    "one front end per process: to serve Slack and Matrix, run `gpubot serve --chat slack` "
    "and `gpubot serve --chat matrix --no-sweeps` on one database"
)


def chat_arg(text: str) -> str:
    """An argparse type: one front end's name; more than one is refused, saying how."""
    if text in CHATS:
        return text
    if text == "both" or "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: {SERVE_BOTH}")
    raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(CHATS)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chat",
        type=chat_arg,
        default="slack",
        metavar="{slack,matrix}",
        help="the chat front end to serve (default slack; matrix: the [matrix] section); "
        "one per process: for both, run one of each on one database, the second with "
        "--no-sweeps",
    )
    parser.add_argument(
        "--http", action="store_true", help="serve the Events API over HTTP instead of Socket Mode"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="HTTP: address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=3000, help="HTTP: port (default 3000)")
    parser.add_argument(
        "--path", default="/slack/events", help="HTTP: request path (default /slack/events)"
    )
    parser.add_argument(
        "--expire-every",
        type=duration_arg,
        default=30.0,
        metavar="S",
        help="check approvals for expiry every S seconds or duration (1m; default 30s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics on port P ([metrics] port)",
    )
    parser.add_argument(
        "--metrics-host",
        metavar="ADDR",
        help="address the metrics listen on ([metrics] host, default "
        "127.0.0.1; a container's own interface: 0.0.0.0)",
    )
    parser.add_argument(
        "--no-sweeps", action="store_true", help="do not run scheduled sweeps in this process"
    )


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a port number (1-65535)")
    if not args.path.startswith("/"):
        raise ConfigError(f"--path {args.path!r}: must start with /")
    if args.metrics_port is not None:
        check_port(args.metrics_port, "--metrics-port")
    environ = os.environ
    if args.chat == "matrix":
        return _run_matrix(args, environ)
    tokens = read_tokens(environ, http=args.http)
    settings = settings_from(args.config, environ)
    _log_setup()
    asyncio.run(_serve(args, settings, tokens, environ))
    return 0


def _log_setup() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _serving(args: argparse.Namespace) -> Serving:
    return Serving(
        sweeps=not args.no_sweeps,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        expire_every_s=args.expire_every,
    )


def _run_matrix(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Serve Matrix: the ``[matrix]`` section of the same settings file, its token's variable."""
    from pathlib import Path

    from gpubot.matrix import settings as matrix_settings

    settings = settings_from(args.config, environ)
    m = matrix_settings.load(Path(settings.path or "gpubot.toml"))
    token = m.token(environ)
    _log_setup()
    asyncio.run(_serve_matrix(args, matrix_settings.on_matrix(settings, m), m, token, environ))
    return 0


async def _serve_matrix(
    args: argparse.Namespace,
    settings: Settings,
    m: MatrixSettings,
    token: str,
    environ: Mapping[str, str],
) -> None:
    from gpubot.matrix.api import MatrixAccess
    from gpubot.matrix.bot import MatrixBot, MatrixParts
    from gpubot.matrix.front import MatrixFront
    from gpubot.matrix.serve import check_login, listen
    from gpubot.matrix.typed import Typed

    front = MatrixFront(MatrixAccess(m.homeserver, m.user_id, token, m.device_id))
    try:
        await check_login(front.api, m.token_env)
    except ConfigError:
        await front.close()
        raise
    app = build(settings, environ, need_store=True, front=front, serving=_serving(args))
    try:
        rooms, servers = frozenset(m.rooms), frozenset(m.servers)
        keeper = app.sweep.keeper
        snoozer = None if keeper is None else keeper.snooze
        typed = Typed(app.flows, snoozer, app.sweep.ladder)
        parts = MatrixParts(app.flows, front.api, rooms, servers, typed)
        async with app.running():
            await listen(MatrixBot(parts))
    finally:
        await app.close()


async def _serve(
    args: argparse.Namespace, settings: Settings, tokens: Tokens, environ: Mapping[str, str]
) -> None:
    from gpubot.services.alert_keeper import NoAlerts
    from gpubot.slack.front import SlackAccess, SlackFront
    from gpubot.slack.serve import Listener, SlackParts, build_bot, check_token, listen

    options = _serving(args)
    # A database that is behind stops us here; the composition root builds everything once.
    front = SlackFront(SlackAccess(tokens.bot, tokens.api_url))
    app = build(settings, environ, need_store=True, front=front, serving=options)
    listener = Listener(
        http=args.http,
        host=args.host,
        port=args.port,
        path=args.path,
        app_token=tokens.app,
        signing_secret=tokens.signing_secret,
    )
    try:
        snoozer = app.sweep.keeper or NoAlerts()
        bot = build_bot(SlackParts(app.flows, front.api, snoozer), tokens.signing_secret)
        await check_token(bot)
        async with app.running():
            await listen(bot, listener)
    finally:
        await app.close()
