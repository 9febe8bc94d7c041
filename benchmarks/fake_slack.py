"""Slack without Slack: a loopback fake of the Web API, and a client that signs like Slack.

``FakeSlack`` serves ``/api/<method>`` on 127.0.0.1 and records every call (method, decoded body,
headers). It answers like Slack (``{"ok": true, ...}``), keeps posted messages so ``chat.update``
of an unknown message fails, rejects blocks that break Slack's limits with ``invalid_blocks`` (a
table block in a Home tab view among them), and can be told to fail a method
(``fail("chat.postMessage", "ratelimited", status=429)``; with ``taken=True`` it does the work
first, keeping the message, as a Slack that took a post and answered HTTP 500 or
``internal_error``) or to refuse every table block on one
path (``refuse_tables("response", "internal_error", status=500)``, as a workspace that cannot
render them). It also serves ``response_url`` endpoints (``/response/<name>``), which answer a
refused body with an HTTP error (400 unless told otherwise) whose text is the error.

``SlackSender`` sends requests exactly as Slack does: form-encoded slash commands, ``payload=``
block actions, JSON events, each signed with ``v0=HMAC-SHA256(secret, "v0:{ts}:{body}")``.

The tests (``tests/fixtures/slack.py``, which adds pytest fixtures) and the benchmarks
(``benchmarks/slack_ack.py``) share it; the limits it judges by are ``benchmarks/slack_limits.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks import slack_limits
from benchmarks.fake_history import history, metadata_problem

BOT_TOKEN = "xoxb-1-test-token"
APP_TOKEN = "xapp-1-test-token"
SECRET = "8f742231b10e8888abcd99ffe1c0d85a5"


@dataclass
class Call:
    """One recorded request to the fake."""

    method: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)
    status: int = 200
    answer: dict[str, Any] = field(default_factory=dict)
    answered_at: float | None = None  # set when a delayed answer went out


@dataclass
class Failure:
    """A planned failure of one method."""

    error: str
    status: int = 200
    retry_after: int | None = None
    times: int = 1
    channel: str | None = None  # only calls for this channel
    taken: bool = False  # the call's work is done (a message kept) before the error answers
    dropped: bool = False  # no answer: the connection is closed instead


# The bot token's scopes by default: the manifest's (deploy/slack-manifest.yml), all of them.
SCOPES = (
    "commands",
    "chat:write",
    "users:read",
    "usergroups:read",
    "users:read.email",
    "im:write",
    "channels:history",
)


class FakeSlack:
    """A loopback fake of the Slack Web API that records every call."""

    def __init__(self, token: str = BOT_TOKEN) -> None:
        self.token = token
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.groups: dict[str, list[str]] = {}
        self.emails: dict[str, str] = {}
        # users.info flags per user id, e.g. {"is_restricted": True} or {"team_id": "T0OTHER"}
        self.users: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, list[Failure]] = {}
        # where table blocks are refused → (error, HTTP status); "response" is every response_url
        self.table_refusals: dict[str, tuple[str, int]] = {}
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.changed = asyncio.Event()
        self.app_token = APP_TOKEN
        self.sockets: list[web.WebSocketResponse] = []
        self.delays: dict[str, float] = {}  # method → seconds it answers after (its work done)
        # (method, channel) → the same, for calls to that channel only (before ``delays``)
        self.channel_delays: dict[tuple[str, str], float] = {}
        self.history_readable = True  # False: conversations.history answers missing_scope
        # The token's scopes, sent as auth.test's x-oauth-scopes header (as Slack does).
        self.scopes = list(SCOPES)
        self.members: set[str] | None = None  # the channels the bot is in (None: every one)
        self._stopping = asyncio.Event()
        self.socket_received: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        """Return the Web API base URL (``SLACK_API_URL``)."""
        return f"http://127.0.0.1:{self.port}/api/"

    def response_url(self, name: str) -> str:
        """Return a ``response_url`` served by the fake."""
        return f"http://127.0.0.1:{self.port}/response/{name}"

    def fail(
        self,
        method: str,
        error: str,
        *,
        status: int = 200,
        retry_after: int | None = None,
        times: int = 1,
        channel: str | None = None,
        taken: bool = False,
        dropped: bool = False,
    ) -> None:
        """Make the next ``times`` calls of ``method`` (to ``channel``, if given) fail;
        ``method`` "response" is any response_url answer (an HTTP error, 400 unless given).
        ``taken``: each of them is done first (a post is kept), then answered with the error.
        ``dropped``: the connection is closed instead of an answer (a Web API method)."""
        failure = Failure(error, status, retry_after, times, channel, taken, dropped)
        self.failures.setdefault(method, []).append(failure)

    def refuse_tables(
        self, where: str, error: str = "invalid_blocks", *, status: int = 200
    ) -> None:
        """Refuse every message carrying a table block on ``where`` (a chat method, or
        ``"response"`` for response_url answers) with ``error``; a response_url refusal is an
        HTTP error (``status`` 400 unless given)."""
        if where == "response" and status == 200:
            status = 400
        self.table_refusals[where] = (error, status)

    def responses(self) -> list[Call]:
        """Return the recorded response_url answers (accepted or not)."""
        return [c for c in self.calls if c.method.startswith("response:")]

    def of(self, method: str) -> list[Call]:
        """Return the recorded calls of ``method`` (answered ok or not)."""
        return [c for c in self.calls if c.method == method]

    def ok(self, method: str) -> list[Call]:
        """Return the calls of ``method`` that succeeded."""
        return [c for c in self.of(method) if c.status == 200 and c.answer.get("ok", True)]

    async def wait_for(self, check: Callable[[], bool], timeout: float = 20.0) -> None:
        """Wait until ``check()`` holds (re-checked after every call)."""
        deadline = time.monotonic() + timeout
        while not check():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; calls: {[c.method for c in self.calls]}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))

    async def start(self) -> None:
        """Listen on 127.0.0.1 (a free port)."""
        app = web.Application()
        app.add_routes(
            [
                web.post("/api/{method}", self._api),
                web.get("/api/{method}", self._api),
                web.post("/response/{name}", self._response),
                web.get("/link", self._socket),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop listening (and close Socket Mode connections)."""
        self._stopping.set()
        for ws in self.sockets:
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        """Serve a Socket Mode connection: hello, then whatever ``socket_send`` sends."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        self._record(Call("socket:connect", dict(request.query), dict(request.headers)))
        await ws.send_json(
            {"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0GPUBOT"}}
        )
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.socket_received.append(json.loads(msg.data))
                self.changed.set()
        return ws

    async def socket_send(self, kind: str, payload: dict[str, Any], envelope_id: str) -> None:
        """Send one Socket Mode envelope (``slash_commands``, ``interactive``, ``events_api``)."""
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind != "events_api",
        }
        await self.sockets[-1].send_json(envelope)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = dict(request.query)
        raw = await request.text()
        if raw and request.content_type == "application/json":
            body.update(json.loads(raw))
        elif raw:
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                body[k] = json.loads(v) if k in ("blocks", "view") and v else v
        return body

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self.changed.set()

    async def _response(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        call = Call(f"response:{request.match_info['name']}", body, dict(request.headers))
        refused = self._refusal("response", body.get("blocks"))
        planned = self.failures.get("response", [])  # fail("response", ...): any response_url
        if planned:
            f = planned[0]
            f.times -= 1
            if f.times <= 0:
                planned.remove(f)
            refused = (f.error, 400 if f.status == 200 else f.status)
        problems = slack_limits.problems({"text": body.get("text"), "blocks": body.get("blocks")})
        if refused is None and problems:
            refused = ("invalid_blocks", 400)
        if refused is not None:
            call.status, call.answer = refused[1], {"ok": False, "error": refused[0]}
            self._record(call)
            return web.Response(status=refused[1], text=refused[0])
        self._record(call)
        return web.Response(text="ok")

    def _refusal(self, where: str, blocks: Any) -> tuple[str, int] | None:
        if where in self.table_refusals and slack_limits.has_table(blocks):
            return self.table_refusals[where]
        return None

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        body = await self._body(request)
        call = Call(method, body, dict(request.headers))
        planned = [
            f for f in self.failures.get(method, []) if f.channel in (None, body.get("channel"))
        ]
        if planned:
            f = planned[0]
            f.times -= 1
            if f.times <= 0:
                self.failures[method].remove(f)
            if f.taken:
                self._answer(method, body)  # done, as Slack may before an error answer
            call.status, call.answer = f.status, {"ok": False, "error": f.error}
            self._record(call)
            if f.dropped and request.transport is not None:
                request.transport.close()  # the client sees the connection lost, no answer
            headers = {"Retry-After": str(f.retry_after)} if f.retry_after is not None else {}
            return web.json_response(call.answer, status=f.status, headers=headers)
        token = self.app_token if method == "apps.connections.open" else self.token
        if request.headers.get("Authorization") != f"Bearer {token}":
            call.answer = {"ok": False, "error": "invalid_auth"}
        else:
            call.answer = self._answer(method, body)
        self._record(
            call
        )  # done (a message kept) before any delay: a slow answer, not a slow Slack
        delay = self.channel_delays.get((method, str(body.get("channel"))))
        delay = self.delays.get(method, 0.0) if delay is None else delay
        if delay:  # cut short only by ``stop``: a test never waits on a client long gone
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            call.answered_at = time.monotonic()
        scopes = {"x-oauth-scopes": ",".join(self.scopes)} if method == "auth.test" else {}
        return web.json_response(call.answer, headers=scopes)

    def _answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "gpubot",
                "team_id": "T0FAKE",
                "user_id": "U0BOT",
                "bot_id": "B0BOT",
            }
        if method == "conversations.info":
            channel = str(body.get("channel"))
            member = self.members is None or channel in self.members
            return {"ok": True, "channel": {"id": channel, "is_member": member}}
        if method == "conversations.history":
            return history(self.messages, body, readable=self.history_readable)
        if method in ("chat.postMessage", "chat.update", "chat.postEphemeral"):
            bad_meta = metadata_problem(body.get("metadata"))
            if bad_meta is not None:
                return {"ok": False, "error": bad_meta}
            blocks = body.get("blocks")
            if isinstance(blocks, str):
                blocks = json.loads(blocks)
            problems = slack_limits.problems({"text": body.get("text"), "blocks": blocks})
            if problems:
                return {"ok": False, "error": "invalid_blocks", "errors": problems}
            refused = self._refusal(method, blocks)
            if refused is not None:
                return {"ok": False, "error": refused[0]}
            channel = str(body.get("channel"))
            if method == "chat.update":
                key = (channel, str(body.get("ts")))
                if key not in self.messages:
                    return {"ok": False, "error": "message_not_found"}
                kept = self.messages[key].get("metadata")  # Slack keeps it unless one is given
                self.messages[key] = {"metadata": kept, **body} if kept else body
                return {"ok": True, "channel": channel, "ts": key[1]}
            ts = f"{int(time.time())}.{next(self._ts):06d}"  # now, as Slack's, and unique
            if method == "chat.postEphemeral":
                return {"ok": True, "message_ts": ts}
            self.messages[(channel, ts)] = body
            return {"ok": True, "channel": channel, "ts": ts, "message": body}
        if method == "views.publish":
            view = body.get("view")
            view = json.loads(view) if isinstance(view, str) else view
            if not isinstance(view, dict):
                return {"ok": False, "error": "invalid_arguments"}
            problems = slack_limits.problems({"blocks": view.get("blocks")}, view=True)
            if problems:
                return {"ok": False, "error": "invalid_blocks", "errors": problems}
            return {"ok": True, "view": view}
        if method == "usergroups.users.list":
            group = str(body.get("usergroup"))
            if group not in self.groups:
                return {"ok": False, "error": "no_such_subteam"}
            return {"ok": True, "users": self.groups[group]}
        if method == "apps.connections.open":
            return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/link?ticket=t1"}
        if method == "users.info":
            user = str(body.get("user"))
            info = {
                "id": user,
                "team_id": "T0FAKE",
                "deleted": False,
                "is_bot": False,
                "is_restricted": False,
                "is_ultra_restricted": False,
                "profile": {"email": self.emails.get(user)},
            }
            return {"ok": True, "user": {**info, **self.users.get(user, {})}}
        return {"ok": False, "error": "unknown_method"}


def sign(secret: str, body: str, timestamp: int) -> str:
    """Return Slack's ``X-Slack-Signature`` of ``body``."""
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass
class Reply:
    """What the bot answered to one request."""

    status: int
    text: str
    seconds: float

    def json(self) -> Any:
        """Return the body decoded."""
        return json.loads(self.text) if self.text else None


class SlackSender:
    """Sends signed requests to the bot exactly as Slack does."""

    def __init__(self, url: str, secret: str = SECRET, fake: FakeSlack | None = None) -> None:
        self.url = url
        self.secret = secret
        self.fake = fake
        self._ids = itertools.count(1)

    async def send(
        self,
        body: str,
        content_type: str,
        *,
        timestamp: int | None = None,
        signature: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """POST ``body`` signed (or with the given signature/timestamp)."""
        ts = int(time.time()) if timestamp is None else timestamp
        hdrs = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": str(ts),
            "X-Slack-Signature": signature or sign(self.secret, body, ts),
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            **(headers or {}),
        }
        started = time.monotonic()
        async with aiohttp.ClientSession() as s, s.post(self.url, data=body, headers=hdrs) as r:
            return Reply(r.status, await r.text(), time.monotonic() - started)

    def command_body(
        self,
        text: str,
        *,
        user: str = "U0ROOT",
        channel: str = "C0GENERAL",
        trigger_id: str | None = None,
    ) -> str:
        """Return a slash command's form body."""
        n = next(self._ids)
        fields = {
            "token": "legacy-verification-token",
            "team_id": "T0FAKE",
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "general",
            "user_id": user,
            "user_name": user.lower(),
            "command": "/gpu",
            "text": text,
            "api_app_id": "A0GPUBOT",
            "is_enterprise_install": "false",
            "response_url": self.fake.response_url(f"cmd{n}") if self.fake else "",
            "trigger_id": trigger_id or f"{n}.1.trigger",
        }
        return urllib.parse.urlencode(fields)

    async def command(self, text: str, **kw: Any) -> Reply:
        """Send ``/gpu text``."""
        return await self.send(self.command_body(text, **kw), "application/x-www-form-urlencoded")

    def action_body(
        self,
        action_id: str,
        value: str,
        *,
        user: str = "U0CAROL",
        channel: str = "C0ONCALL",
        message_ts: str = "1700000000.000001",
        action_ts: str | None = None,
    ) -> str:
        """Return a block action's ``payload=`` form body (a button click)."""
        n = next(self._ids)
        payload = {
            "type": "block_actions",
            "user": {
                "id": user,
                "username": user.lower(),
                "name": user.lower(),
                "team_id": "T0FAKE",
            },
            "api_app_id": "A0GPUBOT",
            "token": "legacy-verification-token",
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel,
                "is_ephemeral": False,
            },
            "trigger_id": f"{n}.2.trigger",
            "team": {"id": "T0FAKE", "domain": "fake"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": "oncall"},
            "message": {"type": "message", "ts": message_ts, "text": "…"},
            "response_url": self.fake.response_url(f"act{n}") if self.fake else "",
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "b",
                    "value": value,
                    "type": "button",
                    "text": {"type": "plain_text", "text": "x"},
                    "action_ts": action_ts or f"{time.time():.6f}",
                }
            ],
        }
        return urllib.parse.urlencode({"payload": json.dumps(payload)})

    async def click(self, action_id: str, value: str, **kw: Any) -> Reply:
        """Click a button."""
        return await self.send(
            self.action_body(action_id, value, **kw), "application/x-www-form-urlencoded"
        )

    def event_body(self, event: dict[str, Any], *, event_id: str | None = None) -> str:
        """Return an Events API callback body."""
        return json.dumps(
            {
                "token": "legacy-verification-token",
                "team_id": "T0FAKE",
                "api_app_id": "A0GPUBOT",
                "event": event,
                "type": "event_callback",
                "event_id": event_id or f"Ev{next(self._ids):08d}",
                "event_time": int(time.time()),
            }
        )

    async def event(self, event: dict[str, Any], **kw: Any) -> Reply:
        """Send an event."""
        return await self.send(self.event_body(event, **kw), "application/json")
