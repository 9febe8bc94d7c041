"""The forms of Slack's ids, which the settings file's people, groups and channels take.

Only ``re`` here: the console and the CLI load the settings without a Slack library. Imported,
it makes Slack the primary front end of the settings (``config.front_ends``).
"""

from __future__ import annotations

import re

from gpubot.config.front_ends import IdForms, register
from gpubot.core.alerting import MessageRef

SLACK_IDS = IdForms(
    "slack",
    user=re.compile(r"[UW][A-Z0-9]{2,30}"),
    group=re.compile(r"S[A-Z0-9]{2,30}"),
    place=re.compile(r"[CGD][A-Z0-9]{2,30}"),
    user_words="a Slack user id (U…/W…)",
    group_words="a Slack user group id (S…)",
    place_words="a channel id (C…)",
    bots=frozenset({"USLACKBOT"}),  # Slackbot
)
register(SLACK_IDS)


def ref_of(channel: str, ts: str) -> MessageRef:
    """Return the reference "CHANNEL/TS" of Slack's message ``ts`` in ``channel``."""
    return MessageRef(f"{channel}/{ts}")


def split_ref(where: str) -> tuple[str, str | None]:
    """Return the channel and message ts of a reference (a bare channel: no ts). A post to a
    reference goes to that message's thread."""
    channel, _, ts = where.partition("/")
    return channel, ts or None
