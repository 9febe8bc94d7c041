"""``gpubot serve``: run the Slack bot, over Socket Mode (default) or HTTP (``--http``), the
Matrix bot (``--chat matrix``), or both (``--chat both``). Each front end runs on a composition
of its own over the one database, as two processes would: each one's approval duty handles its
own requests, DMs to the other's people are handed over to it, and only Slack's sweeps (the
alerts go to its channel) and metrics run. SIGTERM or SIGINT stops both.

The only place that reads Slack secrets, from the environment: ``SLACK_BOT_TOKEN`` (always),
``SLACK_APP_TOKEN`` (Socket Mode), ``SLACK_SIGNING_SECRET`` (HTTP), ``SLACK_API_URL`` (optional:
another Web API host, e.g. Slack's government cloud, or a test fake).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from gpubot.app import App, Serving, build, settings_from
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


CHATS = ("slack", "matrix", "both")


def chat_arg(text: str) -> str:
    """An argparse type: a front end's name, or both."""
    if text in CHATS:
        return text
    if "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: to serve Slack and Matrix, say --chat both")
    raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(CHATS)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chat",
        type=chat_arg,
        default="slack",
        metavar="{slack,matrix,both}",
        help="the chat front end to serve (default slack; matrix: the [matrix] section; both: "
        "each on its own composition over the one database, the sweeps' alerts in Slack)",
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
    tokens = None if args.chat == "matrix" else read_tokens(environ, http=args.http)
    settings = settings_from(args.config, environ)
    matrix = None if args.chat == "slack" else _matrix_login(settings, environ)
    _log_setup()
    asyncio.run(_serve(args, settings, tokens, matrix, environ))
    return 0


def _log_setup() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _serving(args: argparse.Namespace, *, first: bool) -> Serving:
    """How a front end's composition serves; ``first`` False: the other of ``--chat both``,
    which neither sweeps nor serves the metrics (``_sweeper``'s does)."""
    return Serving(
        sweeps=first and not args.no_sweeps,
        metrics=first,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        expire_every_s=args.expire_every,
    )


def _matrix_login(settings: Settings, environ: Mapping[str, str]) -> tuple[MatrixSettings, str]:
    """The ``[matrix]`` section of the same settings file, and its token's variable."""
    from pathlib import Path

    from gpubot.matrix import settings as matrix_settings

    m = matrix_settings.load(Path(settings.path or "gpubot.toml"))
    return m, m.token(environ)


@dataclass(frozen=True)
class Served:
    """One front end's composition: its credentials' check, and its bot's listening."""

    app: App
    check: Callable[[], Awaitable[None]]
    listen: Callable[[asyncio.Event], Awaitable[None]]


async def _serve(
    args: argparse.Namespace,
    settings: Settings,
    tokens: Tokens | None,
    matrix: tuple[MatrixSettings, str] | None,
    environ: Mapping[str, str],
) -> None:
    """Build each front end on its own composition (a database that is behind stops it here),
    check each one's credentials (a refusal is one line), then run them until SIGTERM or
    SIGINT; one that stops stops the other."""
    sweeper = _sweeper(settings, tokens, matrix)
    async with contextlib.AsyncExitStack() as stack:
        built: list[Served] = []
        if tokens is not None:
            built.append(_slack(args, settings, tokens, environ, first=sweeper == "slack"))
            stack.push_async_callback(built[-1].app.close)
        if matrix is not None:
            built.append(_matrix(args, settings, *matrix, environ, first=sweeper == "matrix"))
            stack.push_async_callback(built[-1].app.close)
        for served in built:
            await served.check()
        for served in built:
            await stack.enter_async_context(served.app.running())
        with _stop_on_signals() as stop:
            await listen_all([s.listen for s in built], stop)


def _sweeper(
    settings: Settings, tokens: Tokens | None, matrix: tuple[MatrixSettings, str] | None
) -> str:
    """Which front end sweeps and serves the metrics: Slack's, unless only Matrix has a place
    for the alerts (``--chat both``; alone, each does)."""
    if tokens is None:
        return "matrix"
    if matrix is None or settings.sweep.channel is not None:
        return "slack"
    from gpubot.matrix.settings import on_matrix

    if on_matrix(settings, matrix[0]).sweep.channel is None:
        return "slack"
    print(
        "gpubot: sweeps and metrics run on the Matrix side (Slack has no alerts channel)",
        file=sys.stderr,
    )
    return "matrix"


async def listen_all(
    listens: Sequence[Callable[[asyncio.Event], Awaitable[None]]], stop: asyncio.Event
) -> None:
    """Run every listener until ``stop``, which one that ends (or fails) sets, so that it stops
    the others; each ends, drained, before the apps close, and the first failure is raised."""

    async def until_one_ends(listen: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        try:
            await listen(stop)
        finally:
            stop.set()

    ended = await asyncio.gather(*map(until_one_ends, listens), return_exceptions=True)
    for outcome in ended:
        if isinstance(outcome, BaseException):
            raise outcome


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _matrix(
    args: argparse.Namespace,
    settings: Settings,
    m: MatrixSettings,
    token: str,
    environ: Mapping[str, str],
    *,
    first: bool,
) -> Served:
    """The Matrix bot on its composition; its check asks the homeserver who the token is."""
    from gpubot.matrix.api import MatrixAccess
    from gpubot.matrix.bot import MatrixBot, MatrixParts
    from gpubot.matrix.front import MatrixFront
    from gpubot.matrix.serve import check_login, listen
    from gpubot.matrix.settings import on_matrix
    from gpubot.matrix.typed import Typed

    front = MatrixFront(MatrixAccess(m.homeserver, m.user_id, token, m.device_id))
    serving = _serving(args, first=first)
    app = build(on_matrix(settings, m), environ, need_store=True, front=front, serving=serving)
    keeper = app.sweep.keeper
    typed = Typed(app.flows, None if keeper is None else keeper.snooze, app.sweep.ladder)
    rooms, servers = frozenset(m.rooms), frozenset(m.servers)
    bot = MatrixBot(MatrixParts(app.flows, front.api, rooms, servers, typed))
    return Served(app, partial(check_login, front.api, m.token_env), partial(listen, bot))


def _slack(
    args: argparse.Namespace,
    settings: Settings,
    tokens: Tokens,
    environ: Mapping[str, str],
    *,
    first: bool,
) -> Served:
    """The Slack bot on its composition; its check asks Slack who the token is."""
    from gpubot.services.alert_keeper import NoAlerts
    from gpubot.slack.front import SlackAccess, SlackFront
    from gpubot.slack.serve import Listener, SlackParts, build_bot, check_token, listen

    front = SlackFront(SlackAccess(tokens.bot, tokens.api_url))
    serving = _serving(args, first=first)
    app = build(settings, environ, need_store=True, front=front, serving=serving)
    listener = Listener(
        http=args.http,
        host=args.host,
        port=args.port,
        path=args.path,
        app_token=tokens.app,
        signing_secret=tokens.signing_secret,
    )
    snoozer = app.sweep.keeper or NoAlerts()
    bot = build_bot(SlackParts(app.flows, front.api, snoozer), tokens.signing_secret)
    return Served(app, partial(check_token, front.api), partial(listen, bot, listener))
