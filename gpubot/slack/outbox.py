"""Posts that must appear once: a token in the message metadata, found again in the history.

``post_once`` posts with ``metadata`` (Slack's ``event_type`` / ``event_payload``, unseen by
people) and says how the post ended: ``posted``, ``refused`` (Slack answered no: nothing is in
the channel) or ``uncertain`` (a timeout, a dropped connection, a 5xx: it may be there). The
bot's client never retries a post that may have been taken (``slack.api.retry_handlers``): only
a 429, which Slack documents as not taken, or a connection never made.
``internal_error`` (and ``fatal_error``, ``service_unavailable``) at HTTP 200 may follow a post
Slack took, as its documentation of ``chat.postMessage`` says: before a simpler form is sent,
the history is searched for the token (issue 34: such an alert was posted twice).

``find_post`` pages through ``conversations.history`` (``include_all_metadata``, from a moment
on) for the token. It needs the ``channels:history`` scope (``groups:history`` for a private
channel; ``im:history`` for a DM); without it, or on any error, it says the history could not
be checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gpubot.core.alerting import Delivery, Lookup, Posted
from gpubot.slack.api import BLOCK_ERRORS, MAYBE_TAKEN, SlackApi
from gpubot.slack.blockkit import SlackMessage as Message
from gpubot.slack.blockkit import forms_with_blocks, text_form

log = logging.getLogger(__name__)

ALERT_EVENT = "gpubot_alert_posted"  # the metadata event_type of alert messages
DM_EVENT = "gpubot_dm_posted"  # ... and of direct messages (idle holders, ladder, claims)
HEAD_EVENT = "gpubot_head_posted"  # ... and of the audit head's publications
APPROVAL_EVENT = "gpubot_approval_posted"  # ... and of approvals' requests, re-pings and DMs
LADDER_EVENT = "gpubot_ladder_posted"  # ... and of the reclaim ladder's channel posts
PAGE = 200  # messages a history page asks for (Slack: at most 999, internal apps)
MAX_PAGES = 10
SLACK_SKEW_S = 60.0  # the history is searched from this long before the findings were seen


async def post_once(
    api: SlackApi,
    channel: str,
    msg: Message,
    *,
    token: str,
    event: str = ALERT_EVENT,
    thread_ts: str | None = None,
) -> Posted:
    """Post ``msg`` carrying ``token`` in its metadata; say whether Slack has it. In a thread
    (``thread_ts``) it is also shown in the channel, so ``find_post`` finds it in the history.

    Like ``SlackApi._send``, blocks Slack refuses step down to simpler forms, but only on an
    answer of HTTP 200 that took nothing: after a 5xx it may be there, so nothing follows; after
    an answer that may follow a post it took (``MAYBE_TAKEN``) the history is searched first.
    """
    meta = {"event_type": event, "event_payload": {"token": token}}
    call = api.client.chat_postMessage
    where: dict[str, Any] = {"channel": channel, "metadata": meta}
    if thread_ts is not None:
        where |= {"thread_ts": thread_ts, "reply_broadcast": True}
    forms = [*forms_with_blocks(msg), {**text_form(msg), "blocks": []}]
    since = datetime.now(UTC)
    for n, form in enumerate(forms, 1):
        try:
            resp = await call(**where, **form)
        except SlackApiError as exc:
            status = int(getattr(exc.response, "status_code", 200) or 200)
            err = str(exc.response.get("error", "unknown_error"))
            if status >= 500:  # an answer from the server's side may follow a post it took
                return Posted(Delivery.UNCERTAIN, why=f"HTTP {status} {err}")
            if err in MAYBE_TAKEN:
                found = await _maybe_taken(api, channel, token, since, event, err)
                if found is not None:
                    return found
            if err in BLOCK_ERRORS and n < len(forms):
                log.warning("chat.postMessage refused the blocks (%s): simpler next", err)
                continue
            log.error("chat.postMessage to %s failed: %s", channel, err)
            return Posted(Delivery.REFUSED, why=err)
        except Exception as exc:  # timeouts and connection errors: the post may have landed
            return Posted(Delivery.UNCERTAIN, why=type(exc).__name__)
        return Posted(Delivery.POSTED, (str(resp["channel"]), str(resp["ts"])))
    return Posted(Delivery.REFUSED, why="no form of the message was taken")


async def _maybe_taken(
    api: SlackApi, channel: str, token: str, since: datetime, event: str, err: str
) -> Posted | None:
    """After an answer that may follow a post Slack took: the post if the history has it,
    uncertain if the history cannot be read, None if it provably took nothing."""
    lookup = await find_post(api.client, channel, token, since, event=event)
    if lookup.handle is not None:
        log.info("chat.postMessage answered %s, but the post is there: adopted", err)
        return Posted(Delivery.POSTED, lookup.handle)
    if not lookup.checked:
        return Posted(Delivery.UNCERTAIN, why=f"{err}; {lookup.why}")
    return None


async def find_post(
    client: AsyncWebClient, channel: str, token: str, since: datetime, *, event: str = ALERT_EVENT
) -> Lookup:
    """Look for the message carrying ``token`` in ``channel``'s history since ``since``."""
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
            if _carries(m, event, token):
                return Lookup(True, (channel, str(m["ts"])))
        meta = resp.get("response_metadata")
        cursor = meta.get("next_cursor") if isinstance(meta, Mapping) else None
        if not resp.get("has_more") or not cursor:
            return Lookup(True)
    return Lookup(False, why=f"more than {MAX_PAGES * PAGE} messages to search")


def _carries(message: Any, event: str, token: str) -> bool:
    if not isinstance(message, Mapping) or "ts" not in message:
        return False
    meta = message.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("event_type") != event:
        return False
    payload = meta.get("event_payload")
    return isinstance(payload, Mapping) and payload.get("token") == token
