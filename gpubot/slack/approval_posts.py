"""An approval's messages in Slack, posted once (the approval outbox's ``Poster``).

Each post carries its token in the message ``metadata`` (``APPROVAL_EVENT``) and is made with
``slack.outbox.post_once`` (no retry that could post twice); a post whose answer was lost is
looked for with ``find_post`` in ``conversations.history`` of where it went (a re-ping is a
thread reply also shown in the channel, so the history holds it). A direct message needs the
optional ``im:write`` scope to open, and ``im:history`` to be looked for again.
"""

from __future__ import annotations

from gpubot.chat.message import Message
from gpubot.core.alerting import Lookup, Posted
from gpubot.core.approval.posts import ApprovalPost
from gpubot.slack.api import SlackApi
from gpubot.slack.outbox import APPROVAL_EVENT, find_post, post_once
from gpubot.slack.render import to_slack


class SlackApprovalPoster:
    """Posts and finds approvals' messages through the Web API."""

    def __init__(self, api: SlackApi) -> None:
        self.api = api

    async def post(self, post: ApprovalPost, msg: Message) -> Posted:
        """Post ``msg`` where ``post`` says, carrying its token."""
        return await post_once(
            self.api,
            post.channel,
            to_slack(msg),
            token=post.token,
            event=APPROVAL_EVENT,
            thread_ts=post.thread_ts,
        )

    async def find(self, post: ApprovalPost) -> Lookup:
        """Look for ``post``'s message in the history of where it went, since it was recorded."""
        return await find_post(
            self.api.client, post.channel, post.token, post.created_at, event=APPROVAL_EVENT
        )

    async def direct(self, user: str) -> str | None:
        """Open the direct message with ``user`` (None without ``im:write``, or on failure)."""
        return await self.api.open_dm(user)
