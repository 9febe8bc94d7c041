"""``conversations.history`` for the loopback fake Slack (``fake_slack.FakeSlack``), as Slack
documents it (https://docs.slack.dev/reference/methods/conversations.history):

- newest first; ``oldest`` and ``latest`` are exclusive unless ``inclusive``; ``limit`` defaults
  to 100 and may not exceed 999 (internal apps), answered ``invalid_limit`` past that;
- ``has_more`` and ``response_metadata.next_cursor`` page on; a cursor is the fake's own text;
- a message's ``metadata`` (``event_type``, ``event_payload``) comes back only with
  ``include_all_metadata``;
- the bot token needs ``channels:history`` (``groups:history`` for a private channel): a fake
  told ``history_readable = False`` answers ``missing_scope``, as Slack does without it.

``metadata_problem`` checks ``chat.postMessage``'s ``metadata`` argument the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_LIMIT = 999
TRUE = ("1", "true", True, 1)


def metadata_problem(metadata: Any) -> str | None:
    """Return Slack's error for a ``metadata`` argument it would refuse, or None."""
    if metadata is None:
        return None
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return "invalid_metadata_format"
    if not isinstance(metadata, Mapping):
        return "invalid_metadata_format"
    kind, payload = metadata.get("event_type"), metadata.get("event_payload")
    if not isinstance(kind, str) or not kind or not isinstance(payload, Mapping):
        return "invalid_metadata_schema"
    if len(json.dumps(metadata)) > 8000:
        return "metadata_too_large"
    return None


def history(
    messages: Mapping[tuple[str, str], dict[str, Any]], body: Mapping[str, Any], *, readable: bool
) -> dict[str, Any]:
    """Answer one ``conversations.history`` call over the fake's posted messages."""
    if not readable:
        return {
            "ok": False,
            "error": "missing_scope",
            "needed": "channels:history",
            "provided": "commands,chat:write",
        }
    channel = str(body.get("channel") or "")
    if not channel:
        return {"ok": False, "error": "channel_not_found"}
    try:
        limit = int(body.get("limit") or 100)
        oldest = float(body.get("oldest") or 0)
        latest = float(body["latest"]) if body.get("latest") else float("inf")
        start = int(str(body.get("cursor") or "at:0").removeprefix("at:"))
    except ValueError:
        return {"ok": False, "error": "invalid_arguments"}
    if not 0 < limit <= MAX_LIMIT:
        return {"ok": False, "error": "invalid_limit"}
    inclusive = body.get("inclusive") in TRUE
    meta = body.get("include_all_metadata") in TRUE

    def within(ts: float) -> bool:
        if inclusive:
            return oldest <= ts <= latest
        return oldest < ts < latest

    found = sorted(
        ((ts, m) for (c, ts), m in messages.items() if c == channel and within(float(ts))),
        key=lambda p: float(p[0]),
        reverse=True,
    )
    page = found[start : start + limit]
    out = []
    for ts, m in page:
        msg: dict[str, Any] = {
            "type": "message",
            "ts": ts,
            "bot_id": "B0BOT",
            "text": m.get("text", ""),
            "blocks": m.get("blocks") or [],
        }
        if meta and m.get("metadata") is not None:
            raw = m["metadata"]
            msg["metadata"] = json.loads(raw) if isinstance(raw, str) else raw
        out.append(msg)
    more = start + limit < len(found)
    return {
        "ok": True,
        "messages": out,
        "has_more": more,
        "pin_count": 0,
        "response_metadata": {"next_cursor": f"at:{start + limit}" if more else ""},
    }
