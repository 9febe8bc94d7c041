"""The bolt app: ``/gpu`` commands, Approve / Deny / "Reset GPU N" buttons, the Home tab.

Every handler acknowledges first (usage errors are the acknowledgement itself, so a bad command
answers at once and nothing runs), then runs the slow work in a tracked background task. A
global middleware drops repeated deliveries (``event_id``, a command's ``trigger_id``, a click's
``action_ts``) so a retry never runs an action twice; the store's exactly-once transition is the
backstop for double clicks by people.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.response import BoltResponse

from gpubot.chat.background import Background
from gpubot.chat.drain_view import ACTION_DRAIN_NODE, drain_of
from gpubot.chat.errors import error_message
from gpubot.chat.flows import Flows, help_message
from gpubot.chat.interrupted import ACTION_REVIEW, review
from gpubot.chat.message import NL, Code, Message, Sentence, note, paragraph
from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_DENY, ACTION_RESET_GPU
from gpubot.chat.surface import MessageRef
from gpubot.core import commands
from gpubot.core.policy import Person, resolve
from gpubot.errors import GpubotError, UsageError
from gpubot.slack.api import SlackApi
from gpubot.slack.blockkit import SlackMessage, context
from gpubot.slack.ids import ref_of
from gpubot.slack.mrkdwn import escape
from gpubot.slack.outage import quiet_unreachable
from gpubot.slack.render import NeutralSurface, to_slack, to_view

log = logging.getLogger(__name__)

# What a button does, given who clicked, where to answer and the action's payload.
Click = Callable[[Person, NeutralSurface, dict[str, Any]], Awaitable[None]]


class Deduper:
    """Remembers delivery keys for 15 minutes (at most 10,000 of them)."""

    def __init__(self) -> None:
        self._keys: OrderedDict[str, float] = OrderedDict()

    def seen(self, key: str) -> bool:
        """Record ``key``; return whether it was recorded already (and not expired)."""
        now = time.monotonic()
        while self._keys and (
            len(self._keys) >= 10_000 or next(iter(self._keys.values())) < now - 900.0
        ):
            self._keys.popitem(last=False)
        if key in self._keys:
            return True
        self._keys[key] = now
        return False


def delivery_key(body: dict[str, Any]) -> str | None:
    if body.get("event_id"):
        return f"event:{body['event_id']}"
    if body.get("type") == "block_actions":
        acts = body.get("actions") or [{}]
        user = (body.get("user") or {}).get("id", "")
        return f"action:{user}:{acts[0].get('action_id')}:{acts[0].get('action_ts')}"
    if body.get("command") and body.get("trigger_id"):
        return f"command:{body['trigger_id']}"
    return None


class GpuBot(Background):
    """The Slack front end over the shared flows."""

    def __init__(self, flows: Flows, api: SlackApi, *, signing_secret: str | None) -> None:
        """Register the handlers on ``flows`` (the root's, for Slack); ``signing_secret`` None:
        Socket Mode (no HTTP signatures)."""
        self.services = flows.svc
        self.api = api
        self.client = api.client
        self.flows = flows
        self.dedupe = Deduper()
        super().__init__()
        self.app = AsyncApp(
            client=self.client,
            signing_secret=signing_secret or "",
            request_verification_enabled=signing_secret is not None,
            name="gpubot",
            logger=quiet_unreachable(logging.getLogger("gpubot.slack.bolt")),
        )
        self.app.middleware(self._dedupe)
        self.app.command("/gpu")(self._on_command)
        self.app.action(ACTION_APPROVE)(self._on_decide)
        self.app.action(ACTION_DENY)(self._on_decide)
        self.app.action(ACTION_RESET_GPU)(self._on_reset_button)
        self.app.action(ACTION_DRAIN_NODE)(self._on_drain_button)
        self.app.action(ACTION_REVIEW)(self._on_review)
        self.app.event("app_home_opened")(self._on_home)

    async def _dedupe(
        self, body: dict[str, Any], request: Any, next: Callable[[], Awaitable[None]]
    ) -> BoltResponse | None:
        retry = request.headers.get("x-slack-retry-num") if request is not None else None
        key = delivery_key(body)
        if key is not None and self.dedupe.seen(key):
            log.info("dropping a repeated delivery %s (retry %s)", key, retry or "-")
            return BoltResponse(status=200, body="")
        await next()
        return None

    async def identify(self, user_id: str, name: str) -> Person:
        """Return who a Slack user is on the boxes, or why they are refused (``refused``)."""
        if self.services.approvals is not None:
            return await self.services.approvals.identify(user_id, name)
        found = resolve(self.services.policy, user_id, None, None)  # no store: resets refused
        return Person(user_id, name, found.linux_user, found.refused)

    async def clicker(self, body: dict[str, Any], out: NeutralSurface) -> Person | None:
        """Return who clicked (``body["user"]``), or tell ``out`` why not and return None."""
        user = body.get("user") or {}
        try:
            return await self.identify(str(user.get("id", "")), str(user.get("username") or ""))
        except GpubotError as exc:
            await out.reply(error_message(exc))
            return None

    def on_click(self, action_id: str, what: str, act: Click) -> None:
        """Handle the button ``action_id``: acknowledge, then run ``act`` in the background as
        whoever clicked (``clicker``)."""

        async def clicked(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
            await ack()
            self.spawn(self._as_clicker(act, body, action), what)

        self.app.action(action_id)(clicked)

    async def _as_clicker(self, act: Click, body: dict[str, Any], action: dict[str, Any]) -> None:
        out = self.surface(body)
        who = await self.clicker(body, out)
        if who is not None:
            await act(who, out, action)

    def surface(self, body: dict[str, Any]) -> NeutralSurface:
        channel = body.get("channel_id") or (body.get("channel") or {}).get("id")
        user = body.get("user_id") or (body.get("user") or {}).get("id", "")
        return NeutralSurface(
            self.api, channel=channel, user=user, response_url=body.get("response_url")
        )

    async def _on_command(self, ack: Any, body: dict[str, Any]) -> None:
        text = str(body.get("text") or "")
        try:
            cmd = commands.parse(text)
            self.flows.check(cmd)
        except UsageError as exc:
            await ack(**_ephemeral(note("⚠ ", Sentence(str(exc)), NL, *_usage_hint(text))))
            return
        if isinstance(cmd, commands.Help):
            await ack(**_ephemeral(help_message(commands.help_text(cmd.topic))))
            return
        await ack()
        user = {"id": body.get("user_id"), "username": body.get("user_name")}
        self.spawn(self._command(cmd, body, user, f"/gpu {text.strip()}"), f"/gpu {text[:40]}")

    async def _command(
        self, cmd: commands.Command, body: dict[str, Any], user: dict[str, Any], text: str
    ) -> None:
        who = await self._user(user)
        await self.flows.run(cmd, who, self.surface(body), text=text)

    async def _user(self, user: dict[str, Any]) -> Person:
        """Return who the ``user`` of a request is (``identify``)."""
        return await self.identify(str(user.get("id")), str(user.get("username") or ""))

    async def _on_decide(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        try:
            approval_id = int(str(action.get("value")))
        except ValueError:
            log.warning("a decision with a bad value %r", action.get("value"))
            return
        approve = action.get("action_id") == ACTION_APPROVE
        self.spawn(self._decide(approval_id, approve, body), f"decide {approval_id}")

    async def _decide(self, approval_id: int, approve: bool, body: dict[str, Any]) -> None:
        container = body.get("container") or {}
        handle: MessageRef | None = None
        if container.get("channel_id") and container.get("message_ts"):
            handle = ref_of(str(container["channel_id"]), str(container["message_ts"]))
        who = await self._user(body.get("user") or {})
        await self.flows.decide(approval_id, approve, who, self.surface(body), handle=handle)

    async def _on_reset_button(
        self, ack: Any, body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        await ack()
        node, _, gpu = str(action.get("value")).rpartition(":")
        out = self.surface(body)
        try:
            cmd = commands.parse(f"reset {node} gpu {gpu}")
            self.flows.check(cmd)
        except UsageError as exc:
            self.spawn(out.reply(error_message(exc)), "reset button")
            return
        text = f"/gpu reset {node} gpu {gpu} (alert button)"
        self.spawn(self._command(cmd, body, body.get("user") or {}, text), "reset button")

    async def _on_drain_button(
        self, ack: Any, body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        """A finding's Drain button: ``/gpu drain NODE because SUMMARY`` by the presser."""
        await ack()
        out = self.surface(body)
        try:
            cmd = drain_of(str(action.get("value") or ""))
            self.flows.check(cmd)
        except UsageError as exc:
            self.spawn(out.reply(error_message(exc)), "drain button")
            return
        because = f" because {cmd.reason}" if cmd.reason else ""
        text = f"/gpu drain {cmd.node}{because} (alert button)"
        self.spawn(self._command(cmd, body, body.get("user") or {}, text), "drain button")

    async def _on_home(self, event: dict[str, Any]) -> None:
        if event.get("tab", "home") != "home":
            return
        self.spawn(self._home(str(event.get("user"))), "home")

    async def _home(self, user_id: str, notice: str | None = None) -> None:
        who = await self.identify(user_id, "")
        view = to_view(await self.flows.home(who))  # interrupted actions are read anew each time
        if notice is not None:  # what the click did, under the header
            view["blocks"].insert(1, context(escape(notice)))
        await self.api.publish_home(user_id, view)

    async def _on_review(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        self.spawn(self._review(body.get("user") or {}, str(action.get("value"))), "review")

    async def _review(self, user: dict[str, Any], value: str) -> None:
        who = await self._user(user)
        done = await review(
            self.services.audit, self.services.approvals, who, value, source=self.flows.source
        )
        log.info("Home tab review by %s: %s", who.id, done)
        await self._home(who.id, done)

    def web_app(self, path: str = "/slack/events") -> web.Application:
        """Return the aiohttp application serving Slack's requests at ``path`` (and health)."""

        async def handle(request: web.Request) -> web.Response:
            bolt_resp = await self.app.async_dispatch(await to_bolt_request(request))
            return await to_aiohttp_response(bolt_resp)

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        webapp = web.Application(client_max_size=1 << 20)
        webapp.add_routes([web.post(path, handle), web.get("/healthz", health)])
        return webapp


def _ephemeral(msg: Message) -> SlackMessage:
    return {"response_type": "ephemeral", **to_slack(msg)}


def _usage_hint(text: str) -> tuple[Any, ...]:
    verb = text.split()[0].lower() if text.split() else ""
    if verb in commands.USAGE:
        return paragraph(commands.help_text(verb))
    return ("Try ", Code("/gpu help"), ".")
