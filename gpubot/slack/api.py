"""The Slack Web API, made safe to call: retries on 429, text fallbacks, never an exception.

A message Slack rejects for its blocks is sent again with its table as preformatted text, then as
plain text; a failed ``chat.update`` posts a new message. A post that may have landed
(``maybe_taken``: a 5xx, ``internal_error`` at HTTP 200, a connection lost after sending) is
neither retried nor sent in a simpler form: a duplicate is worse than a missing line, and what
must appear once goes through ``slack.poster``, which looks for it by its token first.
Failures are logged and return None: a Slack outage never stops a reset half-way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from gpubot.core.alerting import MessageRef
from gpubot.core.policy import ChatAccount
from gpubot.errors import ChatCallFailed, ChatUnanswered, GpubotError, nearest
from gpubot.slack.blockkit import SlackMessage, forms_with_blocks, simpler_forms, text_form
from gpubot.slack.ids import ref_of, split_ref

log = logging.getLogger(__name__)

# Errors that mean "these blocks, not this message": try again without tables, then as text.
# ``internal_error`` is among them: Slack has answered it, not ``invalid_blocks``, for blocks it
# could not render (table blocks with raw_text cells, ``markdown`` blocks). A simpler form costs
# one call. But a post so answered may be there (``MAYBE_TAKEN``): only an update steps down.
BLOCK_ERRORS = frozenset(
    {
        "msg_too_long",
        "invalid_blocks",
        "invalid_blocks_format",
        "invalid_attachments",
        "too_many_blocks",
        "block_mismatch",
        "only_one_table_allowed",
        "invalid_arguments",
        "internal_error",
    }
)
# What a Web API or response_url call raises, and what it means: Slack's answer (an error code),
# the client's own refusal, and (slack_sdk lets them through) a timeout or a connection's aiohttp
# error, after which the call may have applied. The nearest class in the MRO chooses.
SLACK_ERRORS: dict[type[BaseException], type[ChatCallFailed]] = {
    SlackApiError: ChatCallFailed,
    SlackClientError: ChatCallFailed,
    TimeoutError: ChatUnanswered,
    aiohttp.ClientError: ChatUnanswered,
    OSError: ChatUnanswered,
}
# Errors that mean "the bot cannot post here": answer through the command's response_url.
NOT_HERE = frozenset({"not_in_channel", "channel_not_found", "is_archived", "restricted_action"})
# Answers at HTTP 200 after which "it is possible some aspect of the operation succeeded"
# (Slack's chat.postMessage errors): a post so answered may be in the channel.
MAYBE_TAKEN = frozenset({"internal_error", "fatal_error", "service_unavailable"})


# A 5xx may follow a post Slack took, so resending one blindly can post it twice.
POSTING = frozenset({"chat.postMessage", "chat.postEphemeral"})


def posts(request: Any) -> bool:
    """Whether a request posts a message: a posting method, or any ``response_url``."""
    url = str(request.url)
    return "/api/" not in url or url.rstrip("/").rsplit("/", 1)[-1] in POSTING


class ServerErrorRetry(AsyncServerErrorRetryHandler):
    """slack_sdk's one retry after HTTP 500/503, for every call but a post: a post that may
    have been taken is looked for by its token before anything is sent again (``slack.poster``)."""

    async def _can_retry_async(self, *, request: Any, **kwargs: Any) -> bool:
        return not posts(request) and await super()._can_retry_async(request=request, **kwargs)


class ConnectionErrorRetry(AsyncConnectionErrorRetryHandler):
    """slack_sdk's retries after a lost connection, for a post only when no connection was
    made (``ClientConnectorError``: nothing was sent); after that, it may have landed."""

    async def _can_retry_async(self, *, request: Any, error: Any = None, **kwargs: Any) -> bool:
        if posts(request) and not isinstance(error, aiohttp.ClientConnectorError):
            return False
        return await super()._can_retry_async(request=request, error=error, **kwargs)


def retry_handlers() -> list[Any]:
    return [
        ConnectionErrorRetry(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=3),
        ServerErrorRetry(max_retry_count=1),
    ]


class WebSession:
    """One aiohttp session (one connection pool) for every Web API call of a bot.

    Made on first use, on the running loop (aiohttp binds a session to its loop), with the
    clients' timeout (slack_sdk applies its own per call only to sessions it makes). After
    ``close`` it hands out nothing: a late call gets slack_sdk's session of its own.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.made = 0  # sessions made: one in a bot's life, unless one was closed under it
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def get(self) -> aiohttp.ClientSession | None:
        """Return the shared session; None after ``close`` or off-loop."""
        if self._closed:
            return None
        if self._session is None or self._session.closed:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return None
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
            self.made += 1
        return self._session

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class PooledWebClient(AsyncWebClient):
    """An ``AsyncWebClient`` whose every call, and every per-request copy bolt makes of it
    (bolt copies ``client.session``), goes over one ``WebSession``."""

    def __init__(self, pool: WebSession, **kwargs: Any) -> None:
        self.pool = pool
        super().__init__(**kwargs)

    @property
    def session(self) -> aiohttp.ClientSession | None:  # slack_sdk reads it on every call
        return self.pool.get()

    @session.setter
    def session(self, value: aiohttp.ClientSession | None) -> None:
        if value is not None:  # AsyncBaseClient.__init__ sets None; nothing else sets it
            raise ValueError("a PooledWebClient's session is its pool's")


TIMEOUT_S = 10  # the Web API client's, per call


def make_client(
    token: str, base_url: str, *, timeout: int = TIMEOUT_S, shared_session: bool = False
) -> AsyncWebClient:
    """Return a Web API client for ``base_url`` (which ends with ``/``) with the retry policy;
    ``shared_session``: every call over one ``WebSession`` (close it with ``SlackApi.close``)."""
    kwargs: dict[str, Any] = dict(
        token=token, base_url=base_url, timeout=timeout, retry_handlers=retry_handlers()
    )
    if shared_session:
        return PooledWebClient(WebSession(timeout), **kwargs)
    return AsyncWebClient(**kwargs)


def answered(exc: ChatCallFailed) -> bool:
    """Whether Slack itself answered the failed call with an error code."""
    return isinstance(exc.__cause__, SlackApiError)


def maybe_taken(exc: ChatCallFailed) -> bool:
    """Whether a failed call may have applied: no answer, a 5xx, or one of ``MAYBE_TAKEN``."""
    response = getattr(exc, "response", None) or getattr(exc.__cause__, "response", None)
    status = int(getattr(response, "status_code", 200) or 200)
    return isinstance(exc, ChatUnanswered) or status >= 500 or exc.error in MAYBE_TAKEN


@contextmanager
def slack_errors(method: str) -> Iterator[None]:
    """Turn the library errors of a call to ``method`` into ``ChatCallFailed`` ("method: code")."""
    try:
        yield
    except GpubotError:
        raise
    except Exception as exc:
        kind = nearest(type(exc), SLACK_ERRORS)
        if kind is None:
            raise
        error = type(exc).__name__
        if isinstance(exc, SlackApiError):
            error = str(exc.response.get("error", "unknown_error"))
        raise kind(method, error) from exc


async def call(client: AsyncWebClient, method: str, **kwargs: Any) -> Any:
    """Call the Web API ``method`` (``chat.postMessage``) through ``slack_errors``."""
    with slack_errors(method):
        return await getattr(client, method.replace(".", "_"))(**kwargs)


class SlackApi:
    """The few Web API calls gpubot makes, each with its fallback."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.pool = client.pool if isinstance(client, PooledWebClient) else None
        self._dms: dict[str, str] = {}  # Slack user id → their direct message's channel id

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def post(
        self, channel: str, msg: SlackMessage, *, response_url: str | None = None
    ) -> MessageRef | None:
        """Post ``msg`` (blocks, else text); if the bot cannot post there, use ``response_url``."""
        try:
            resp = await self._send("chat.postMessage", msg, channel=channel)
        except ChatCallFailed as exc:
            if exc.error in NOT_HERE and response_url:
                await self.respond(response_url, msg, ephemeral=False)
            elif maybe_taken(exc):
                log.warning("chat.postMessage to %s may not have appeared (%s)", channel, exc.error)
            else:
                log.error("chat.postMessage to %s failed: %s", channel, exc.error)
            return None
        return ref_of(str(resp["channel"]), str(resp["ts"]))

    async def update(self, handle: MessageRef | None, msg: SlackMessage) -> MessageRef | None:
        """Replace a message; if Slack refuses, post a new one and return where it is. If the
        update may have applied (``maybe_taken``), post nothing: a second message is worse."""
        if handle is None:
            return None
        channel, ts = split_ref(handle)
        if ts is None:
            return await self.post(channel, msg)
        try:
            await self._send("chat.update", msg, channel=channel, ts=ts)
            return handle
        except ChatCallFailed as exc:
            if maybe_taken(exc):
                log.warning("chat.update %s/%s may not have applied (%s)", channel, ts, exc.error)
                return handle
            log.warning("chat.update %s/%s failed (%s): posting anew", channel, ts, exc.error)
        return await self.post(channel, msg)

    async def respond(
        self, response_url: str, msg: SlackMessage, *, ephemeral: bool = True
    ) -> None:
        """Answer through a command's or action's ``response_url``: as is, without tables, as text.
        A webhook: a refusal is any answer but HTTP 200. It takes only a few answers (Slack's
        "Handling user interaction" guide), so a message without a table skips the middle step.
        """
        session = self.pool.get() if self.pool is not None else None
        hook = AsyncWebhookClient(
            response_url, timeout=10, session=session, retry_handlers=retry_handlers()
        )
        kind = "ephemeral" if ephemeral else "in_channel"
        for body in simpler_forms(msg):
            try:
                with slack_errors("response_url"):
                    resp = await hook.send_dict(
                        {**body, "response_type": kind, "replace_original": False}
                    )
            except ChatCallFailed as exc:  # the answer is lost, never the action
                log.error("response_url failed: %r", exc.__cause__)
                return
            if resp.status_code == 200:
                return
            log.warning(
                "response_url answered %s %s: simpler next", resp.status_code, str(resp.body)[:100]
            )

    async def ephemeral(
        self, channel: str | None, user: str, msg: SlackMessage, *, response_url: str | None
    ) -> None:
        if response_url:
            await self.respond(response_url, msg)
            return
        if channel is None:
            return
        try:
            await self._send("chat.postEphemeral", msg, channel=channel, user=user)
        except ChatCallFailed as exc:
            if maybe_taken(exc):
                log.warning("chat.postEphemeral may not have appeared (%s)", exc.error)
            else:
                log.error("chat.postEphemeral failed: %s", exc.error)

    async def open_dm(self, user: str) -> str | None:
        """Return the channel id of the direct message with ``user``; None (logged) without the
        optional ``im:write`` scope or on any failure: a DM is a courtesy, never a reason to fail.
        A channel found is remembered: one ``conversations.open`` per person.
        """
        if user in self._dms:
            return self._dms[user]
        try:
            resp = await call(self.client, "conversations.open", users=user)
        except ChatCallFailed as exc:
            err = exc.error
            hint = " (add the im:write scope to the Slack app)" if err == "missing_scope" else ""
            log.warning("conversations.open with %s failed: %s%s", user, err, hint)
            return None
        channel = resp.get("channel")
        found = channel.get("id") if isinstance(channel, Mapping) else None
        if not isinstance(found, str) or not found:
            log.warning("conversations.open with %s named no channel", user)
            return None
        self._dms[user] = found
        return found

    async def publish_home(self, user: str, view: Mapping[str, Any]) -> bool:
        try:
            await call(self.client, "views.publish", user_id=user, view=dict(view))
            return True
        except ChatCallFailed as exc:
            log.error("views.publish for %s failed: %s", user, exc.error)
            return False

    async def _send(self, method: str, msg: SlackMessage, **where: Any) -> Any:
        """Call a chat method; if Slack refuses the blocks, retry without tables, then as text.
        The simpler forms are made only when needed: a message shared by many requests (one
        fleet answer) costs each of them one call, not two more renders. A post that may have
        landed (``maybe_taken``) steps down no further."""
        for attempt in forms_with_blocks(msg):
            try:
                return await call(self.client, method, **where, **attempt)
            except ChatCallFailed as exc:
                if exc.error not in BLOCK_ERRORS or (method in POSTING and maybe_taken(exc)):
                    raise
                name = method.replace(".", "_")  # as the log has always named it
                log.warning("%s refused the blocks (%s): simpler next", name, exc.error)
        return await call(self.client, method, **where, **text_form(msg), blocks=[])


class SlackDirectory:
    """User groups and accounts (the approvals service caches them)."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

    async def group_members(self, group_id: str) -> frozenset[str]:
        resp = await call(self.client, "usergroups.users.list", usergroup=group_id)
        return frozenset(str(u) for u in resp.get("users") or [])

    async def account(self, user_id: str) -> ChatAccount:
        """The e-mail needs users:read.email."""
        resp = await call(self.client, "users.info", user=user_id)
        return account_of(user_id, resp.get("user"))

    async def home_team(self) -> str | None:
        """Return the team id of the bot token's workspace."""
        resp = await call(self.client, "auth.test")
        team = resp.get("team_id")
        if not isinstance(team, str) or not team:
            raise GpubotError("auth.test named no team")
        return team


def account_of(user_id: str, user: Any) -> ChatAccount:
    """Build a ``ChatAccount`` from a ``users.info`` user (missing flags: not set)."""
    if not isinstance(user, Mapping) or user.get("id") not in (None, user_id):
        raise GpubotError(f"users.info: no account {user_id} in the answer")
    u: Mapping[str, Any] = user
    profile = u.get("profile")
    email = profile.get("email") if isinstance(profile, Mapping) else None
    team = u.get("team_id")

    def flag(name: str) -> bool:
        return u.get(name) is True

    return ChatAccount(
        id=user_id,
        team_id=team if isinstance(team, str) and team else None,
        email=email if isinstance(email, str) else None,
        deleted=flag("deleted"),
        bot=flag("is_bot") or flag("is_app_user"),
        guest=flag("is_restricted") or flag("is_ultra_restricted"),  # multi- or single-channel
        stranger=flag("is_stranger"),
    )
