"""The Slack Web API, made safe to call: retries on 429, text fallbacks, never an exception.

``SlackApi`` wraps ``AsyncWebClient`` (its retry handlers wait ``Retry-After`` on 429). A message
Slack rejects for its blocks (``msg_too_long``, ``invalid_blocks``, ``internal_error`` …) is sent
again with its table as preformatted text, then as plain text, through the Web API and through a
``response_url`` alike; a failed ``chat.update`` posts a new message.
Failures are logged and return None: a Slack outage never stops a reset half-way or leaves an
approval in a wrong state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from gpubot.chat.blocks import Message, text_only, without_tables
from gpubot.chat.surface import Handle
from gpubot.core.policy import ChatAccount
from gpubot.errors import GpubotError

log = logging.getLogger(__name__)

# Errors that mean "these blocks, not this message": try again without tables, then as text.
# ``internal_error`` is among them: Slack has answered it, not ``invalid_blocks``, for blocks it
# could not render (table blocks with raw_text cells, soxtoby/SlackNet#246; ``markdown`` blocks,
# slackapi/python-slack-sdk#1756). A simpler form costs one call; an outage fails it again.
BLOCK_ERRORS = frozenset({
    "msg_too_long", "invalid_blocks", "invalid_blocks_format", "invalid_attachments",
    "too_many_blocks", "block_mismatch", "only_one_table_allowed", "invalid_arguments",
    "internal_error",
})  # fmt: skip
# Errors that mean "the bot cannot post here": answer through the command's response_url.
NOT_HERE = frozenset({"not_in_channel", "channel_not_found", "is_archived", "restricted_action"})


def retry_handlers() -> list[Any]:
    """Return the retry policy: connection errors, 429 (Retry-After), one 5xx retry."""
    return [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=3),
        AsyncServerErrorRetryHandler(max_retry_count=1),
    ]


def make_client(token: str, base_url: str, *, timeout: int = 10) -> AsyncWebClient:
    """Return a Web API client for ``base_url`` (which ends with ``/``) with the retry policy."""
    return AsyncWebClient(
        token=token, base_url=base_url, timeout=timeout, retry_handlers=retry_handlers()
    )


def _error(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", "unknown_error"))
    return type(exc).__name__


class SlackApi:
    """The few Web API calls gpubot makes, each with its fallback."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

    async def post(
        self, channel: str, msg: Message, *, response_url: str | None = None
    ) -> Handle | None:
        """Post ``msg`` (blocks, else text); if the bot cannot post there, use ``response_url``."""
        try:
            resp = await self._send("chat_postMessage", msg, channel=channel)
        except (SlackApiError, SlackClientError) as exc:
            err = _error(exc)
            if err in NOT_HERE and response_url:
                await self.respond(response_url, msg, ephemeral=False)
            else:
                log.error("chat.postMessage to %s failed: %s", channel, err)
            return None
        return str(resp["channel"]), str(resp["ts"])

    async def update(self, handle: Handle | None, msg: Message) -> Handle | None:
        """Replace a message; if that fails, post a new one and return where it is."""
        if handle is None:
            return None
        channel, ts = handle
        try:
            await self._send("chat_update", msg, channel=channel, ts=ts)
            return handle
        except (SlackApiError, SlackClientError) as exc:
            log.warning("chat.update %s/%s failed (%s): posting anew", channel, ts, _error(exc))
        return await self.post(channel, msg)

    async def respond(self, response_url: str, msg: Message, *, ephemeral: bool = True) -> None:
        """Answer through a command's or action's ``response_url``: as is, without tables, as text.

        The same steps as ``_send``. A ``response_url`` is a webhook, not a Web API method: a
        refusal is any answer but HTTP 200 (its body is logged, not relied on), and it steps
        down. A ``response_url`` takes only five answers in 30 minutes (Slack's "Handling user
        interaction" guide, https://api.slack.com/interactivity/handling#message_responses), so
        a message without a table skips the middle step, and text is the last try.
        """
        hook = AsyncWebhookClient(response_url, timeout=10, retry_handlers=retry_handlers())
        kind = "ephemeral" if ephemeral else "in_channel"
        for body in _simpler(msg):
            try:
                resp = await hook.send_dict({**body, "response_type": kind,
                                             "replace_original": False})  # fmt: skip
            except Exception as exc:  # aiohttp errors: the answer is lost, never the action
                log.error("response_url failed: %r", exc)
                return
            if resp.status_code == 200:
                return
            log.warning("response_url answered %s %s: simpler next", resp.status_code,
                        str(resp.body)[:100])  # fmt: skip

    async def ephemeral(
        self, channel: str | None, user: str, msg: Message, *, response_url: str | None
    ) -> None:
        """Show ``msg`` to one user only."""
        if response_url:
            await self.respond(response_url, msg)
            return
        if channel is None:
            return
        try:
            await self._send("chat_postEphemeral", msg, channel=channel, user=user)
        except (SlackApiError, SlackClientError) as exc:
            log.error("chat.postEphemeral failed: %s", _error(exc))

    async def open_dm(self, user: str) -> str | None:
        """Open (or find) the direct message with ``user``; return its channel id or None.

        ``conversations.open`` needs the optional ``im:write`` scope: without it, or on any
        failure, this logs why and returns None (a DM is a courtesy, never a reason to fail).
        """
        try:
            resp = await self.client.conversations_open(users=user)
        except (SlackApiError, SlackClientError) as exc:
            err = _error(exc)
            hint = " (add the im:write scope to the Slack app)" if err == "missing_scope" else ""
            log.warning("conversations.open with %s failed: %s%s", user, err, hint)
            return None
        channel = resp.get("channel")
        found = channel.get("id") if isinstance(channel, Mapping) else None
        if not isinstance(found, str) or not found:
            log.warning("conversations.open with %s named no channel", user)
            return None
        return found

    async def publish_home(self, user: str, view: Mapping[str, Any]) -> bool:
        """Publish the Home tab of ``user``."""
        try:
            await self.client.views_publish(user_id=user, view=dict(view))
            return True
        except (SlackApiError, SlackClientError) as exc:
            log.error("views.publish for %s failed: %s", user, _error(exc))
            return False

    async def _send(self, method: str, msg: Message, **where: Any) -> Any:
        """Call a chat method; if Slack refuses the blocks, retry without tables, then as text."""
        call = getattr(self.client, method)
        *richer, text = _simpler(msg)
        for attempt in richer:
            try:
                return await call(**where, **attempt)
            except SlackApiError as exc:
                if _error(exc) not in BLOCK_ERRORS:
                    raise
                log.warning("%s refused the blocks (%s): simpler next", method, _error(exc))
        return await call(**where, **text, blocks=[])


def _simpler(msg: Message) -> list[Message]:
    """Return the forms to try in turn: ``msg``, then without tables (if it has one), then text.

    A message without blocks is sent as it is (one try).
    """
    if not msg.get("blocks"):
        return [{k: v for k, v in msg.items() if k != "blocks"}]
    plain = without_tables(msg)
    return [msg, *([plain] if plain is not None else []), text_only(msg)]


class SlackSurface:
    """Where one command's or click's messages go in Slack."""

    def __init__(
        self, api: SlackApi, *, channel: str | None, user: str, response_url: str | None
    ) -> None:
        self.api = api
        self.channel = channel
        self.user = user
        self.response_url = response_url

    async def reply(self, msg: Message) -> None:
        """Answer the person only."""
        await self.api.ephemeral(self.channel, self.user, msg, response_url=self.response_url)

    async def post(self, msg: Message, *, channel: str | None = None) -> Handle | None:
        """Post in the conversation of the command (or in ``channel``)."""
        target = channel or self.channel
        if target is None:
            await self.reply(msg)
            return None
        url = self.response_url if channel is None else None
        return await self.api.post(target, msg, response_url=url)

    async def update(self, handle: Handle | None, msg: Message) -> Handle | None:
        """Replace a posted message (post anew if that fails)."""
        if handle is None:
            return await self.post(msg)
        return await self.api.update(handle, msg)


class SlackDirectory:
    """User groups and accounts through the Web API (the approvals service caches them)."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

    async def group_members(self, group_id: str) -> frozenset[str]:
        """Return the members of a user group (``usergroups.users.list``)."""
        try:
            resp = await self.client.usergroups_users_list(usergroup=group_id)
        except (SlackApiError, SlackClientError) as exc:
            raise GpubotError(f"usergroups.users.list: {_error(exc)}") from None
        return frozenset(str(u) for u in resp.get("users") or [])

    async def account(self, user_id: str) -> ChatAccount:
        """Return what ``users.info`` says of a user (the e-mail needs users:read.email)."""
        try:
            resp = await self.client.users_info(user=user_id)
        except (SlackApiError, SlackClientError) as exc:
            raise GpubotError(f"users.info: {_error(exc)}") from None
        return account_of(user_id, resp.get("user"))

    async def home_team(self) -> str | None:
        """Return the team id of the workspace the bot token belongs to (``auth.test``)."""
        try:
            resp = await self.client.auth_test()
        except (SlackApiError, SlackClientError) as exc:
            raise GpubotError(f"auth.test: {_error(exc)}") from None
        team = resp.get("team_id")
        if not isinstance(team, str) or not team:
            raise GpubotError("auth.test named no team")
        return team


def account_of(user_id: str, user: Any) -> ChatAccount:
    """Build a ``ChatAccount`` from a ``users.info`` user object (missing flags: not set)."""
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
        is_bot=flag("is_bot") or flag("is_app_user"),
        is_restricted=flag("is_restricted"),
        is_ultra_restricted=flag("is_ultra_restricted"),
        is_stranger=flag("is_stranger"),
    )
