"""Slack's side of the outbox: a token in the message metadata, found again in the history.

``post_once`` posts with ``metadata`` (unseen by people) and says how the post ended:
``posted``, ``refused`` (nothing is in the channel) or ``uncertain`` (a timeout, a dropped
connection, a 5xx: it may be there; the client never retries those: ``slack.api``).
``find_post`` pages through ``conversations.history`` for the token; without the
``channels:history`` scope (``groups:history``, ``im:history``), or on any error, it says the
history could not be checked. A post to a message's reference goes to its thread, also shown
in the channel, so the history holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gpubot.chat.approval_words import may_repeat
from gpubot.chat.message import Message
from gpubot.core.alerting import Delivery, Lookup, Posted
from gpubot.slack.api import BLOCK_ERRORS, MAYBE_TAKEN, SlackApi
from gpubot.slack.blockkit import SlackMessage, forms_with_blocks, text_form
from gpubot.slack.ids import ref_of, split_ref
from gpubot.slack.render import to_slack

log = logging.getLogger(__name__)

EVENT = "gpubot_posted"  # the metadata event_type of every post made once
OLD_EVENTS = "gpubot_"  # ... and the prefix of the types earlier versions posted with
PAGE = 200  # messages a history page asks for (Slack: at most 999, internal apps)
MAX_PAGES = 10
SLACK_SKEW_S = 60.0  # the history is searched from this long before the post's intent


async def post_once(api: SlackApi, to: str, msg: SlackMessage, *, token: str) -> Posted:
    """Post ``msg`` to ``to`` (a channel, or a message's thread) carrying ``token``; say whether
    Slack has it. Refused blocks step down to simpler forms only on an answer of HTTP 200 that
    took nothing: after a 5xx nothing follows; after ``MAYBE_TAKEN`` (which Slack documents may
    follow a post it took) the history is searched first."""
    channel, thread = split_ref(to)
    meta = {"event_type": EVENT, "event_payload": {"token": token}}
    where: dict[str, Any] = {"channel": channel, "metadata": meta}
    if thread is not None:
        where |= {"thread_ts": thread, "reply_broadcast": True}
    forms = [*forms_with_blocks(msg), {**text_form(msg), "blocks": []}]
    since = datetime.now(UTC)
    for n, form in enumerate(forms, 1):
        try:
            resp = await api.client.chat_postMessage(**where, **form)
        except SlackApiError as exc:
            status = int(getattr(exc.response, "status_code", 200) or 200)
            err = str(exc.response.get("error", "unknown_error"))
            if status >= 500:  # an answer from the server's side may follow a post it took
                return Posted(Delivery.UNCERTAIN, why=f"HTTP {status} {err}")
            if err in MAYBE_TAKEN:
                found = await _maybe_taken(api, channel, token, since, err)
                if found is not None:
                    return found
            if err in BLOCK_ERRORS and n < len(forms):
                log.warning("chat.postMessage refused the blocks (%s): simpler next", err)
                continue
            log.error("chat.postMessage to %s failed: %s", channel, err)
            return Posted(Delivery.REFUSED, why=err)
        except Exception as exc:  # timeouts and connection errors: the post may have landed
            return Posted(Delivery.UNCERTAIN, why=type(exc).__name__)
        return Posted(Delivery.POSTED, ref_of(str(resp["channel"]), str(resp["ts"])))
    return Posted(Delivery.REFUSED, why="no form of the message was taken")


async def _maybe_taken(
    api: SlackApi, channel: str, token: str, since: datetime, err: str
) -> Posted | None:
    """After an answer that may follow a post Slack took: the post if the history has it,
    uncertain if the history cannot be read, None if it provably took nothing."""
    lookup = await find_post(api.client, channel, token, since)
    if lookup.ref is not None:
        log.info("chat.postMessage answered %s, but the post is there: adopted", err)
        return Posted(Delivery.POSTED, lookup.ref)
    if not lookup.checked:
        return Posted(Delivery.UNCERTAIN, why=f"{err}; {lookup.why}")
    return None


async def find_post(client: AsyncWebClient, to: str, token: str, since: datetime) -> Lookup:
    """Look for the message carrying ``token`` in ``to``'s channel since ``since``."""
    channel, _ = split_ref(to)
    oldest = f"{max(0.0, since.timestamp() - SLACK_SKEW_S):.6f}"
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        try:
            resp = await client.conversations_history(
                channel=channel,
                oldest=oldest,
                include_all_metadata=True,
                limit=PAGE,
                cursor=cursor,
            )
        except SlackApiError as exc:
            err = str(exc.response.get("error", "unknown_error"))
            if err == "missing_scope" and channel.startswith("D"):
                err += " (add im:history to look for a direct message)"
            elif err == "missing_scope":
                err += " (add channels:history, or groups:history for a private channel)"
            return Lookup(False, why=f"conversations.history: {err}")
        except Exception as exc:  # a timeout, a dropped connection
            return Lookup(False, why=f"conversations.history: {type(exc).__name__}")
        for m in resp.get("messages") or []:
            if _carries(m, token):
                return Lookup(True, ref_of(channel, str(m["ts"])))
        meta = resp.get("response_metadata")
        cursor = meta.get("next_cursor") if isinstance(meta, Mapping) else None
        if not resp.get("has_more") or not cursor:
            return Lookup(True)
    return Lookup(False, why=f"more than {MAX_PAGES * PAGE} messages to search")


def _carries(message: Any, token: str) -> bool:
    if not isinstance(message, Mapping) or "ts" not in message:
        return False
    meta = message.get("metadata")
    if not isinstance(meta, Mapping) or not str(meta.get("event_type")).startswith(OLD_EVENTS):
        return False
    payload = meta.get("event_payload")
    return isinstance(payload, Mapping) and payload.get("token") == token


class SlackPoster:
    """The outbox's ``Poster`` in Slack: neutral messages posted once, and found."""

    def __init__(self, api: SlackApi) -> None:
        self.api = api

    async def post(
        self, to: str, msg: Message, *, token: str, repeat_of: datetime | None = None
    ) -> Posted:
        shown = msg if repeat_of is None else may_repeat(msg, repeat_of)
        return await post_once(self.api, to, to_slack(shown), token=token)

    async def find(self, to: str, token: str, since: datetime) -> Lookup:
        return await find_post(self.api.client, to, token, since)

    async def direct(self, user: str) -> str | None:
        return await self.api.open_dm(user)
