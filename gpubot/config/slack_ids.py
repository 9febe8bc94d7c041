"""The forms of Slack's ids: what the settings file's Slack ids must look like, and Slackbot.

They are part of the settings' format (``[approvals] approvers``, ``[users]``, channels), so
they live with the settings: only ``re`` here, so the settings, the console entry and the
Slack front end validate ids without loading a Slack library, and no layer climbs to ``slack/``.
"""

from __future__ import annotations

import re

SLACK_USER = re.compile(r"[UW][A-Z0-9]{2,30}")
SLACK_GROUP = re.compile(r"S[A-Z0-9]{2,30}")
SLACK_CHANNEL = re.compile(r"[CGD][A-Z0-9]{2,30}")
SLACKBOT = "USLACKBOT"
BOTS = frozenset({SLACKBOT})  # the chat system's own bot accounts: never mapped to a person
