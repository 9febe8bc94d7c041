"""Neutral messages (``gpubot.chat.message``) as Block Kit: the one place chat text meets mrkdwn.

Plain text is escaped here (``slack.mrkdwn``), people become mentions, dates Slack's date tokens,
actions buttons.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpubot.chat.layout import MAX_FALLBACK, clip
from gpubot.chat.message import (
    Action,
    Actions,
    Break,
    Clipped,
    Code,
    Context,
    Date,
    DateStyle,
    Emph,
    Heading,
    Mention,
    Message,
    Part,
    Place,
    Pre,
    Section,
    Sentence,
    Span,
    Strong,
    Struck,
    Table,
    Text,
)
from gpubot.slack.blockkit import (
    Block,
    SlackMessage,
    confirm_dialog,
    context,
    header,
    pre,
    section,
    table,
)
from gpubot.slack.ids import split_ref
from gpubot.slack.mrkdwn import clip_mrkdwn, code, code_safe, date, escape, mrkdwn, time_of_day

if TYPE_CHECKING:
    from gpubot.core.alerting import MessageRef
    from gpubot.slack.api import SlackApi


def span_mrkdwn(s: Span) -> str:
    if isinstance(s, str):
        return escape(s)
    if isinstance(s, Break):
        return "\n"
    if isinstance(s, Code):
        return code(s.text)
    if isinstance(s, Sentence):
        return mrkdwn(s.text)
    if isinstance(s, Mention):  # a Slack user group (S…) is mentioned as one
        return f"<!subteam^{s.id}>" if s.id.startswith("S") else f"<@{s.id}>"
    if isinstance(s, Date):
        return time_of_day(s.at) if s.style is DateStyle.TIME else date(s.at)
    if isinstance(s, Strong):
        return f"*{text_mrkdwn(s.parts)}*"
    if isinstance(s, Emph):
        return f"_{text_mrkdwn(s.parts)}_"
    if isinstance(s, Struck):
        return f"~{text_mrkdwn(s.parts)}~"
    if isinstance(s, Clipped):
        return clip_mrkdwn(text_mrkdwn(s.parts), s.most)
    if isinstance(s, Place):
        return f"<#{split_ref(s.handle)[0]}>"
    raise TypeError(f"not a span: {s!r}")


def text_mrkdwn(text: Text) -> str:
    return "".join(span_mrkdwn(s) for s in text)


def button(a: Action) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "button", "action_id": a.id, "value": a.value}
    if a.style is not None:
        out["style"] = str(a.style)
    out["text"] = {"type": "plain_text", "text": a.label}
    c = a.confirm
    if c is not None:
        style = None if c.style is None else str(c.style)
        out["confirm"] = confirm_dialog(
            c.title, c.text, confirm=c.confirm, deny=c.deny, style=style
        )
    return out


def to_block(p: Part) -> Block:
    if isinstance(p, Heading):
        return header(p.text)
    if isinstance(p, Section):
        blk = section(text_mrkdwn(p.text))
        if p.accessory is not None:
            blk["accessory"] = button(p.accessory)
        return blk
    if isinstance(p, Pre):
        return section(pre(code_safe(line) for line in p.lines))
    if isinstance(p, Table):
        return table(p.rows, wrap=p.wrap, right=p.right)
    if isinstance(p, Context):
        return context(*(text_mrkdwn(t) for t in p.parts))
    if isinstance(p, Actions):
        blk = {"type": "actions"}
        if p.group is not None:
            blk["block_id"] = p.group
        blk["elements"] = [button(a) for a in p.actions]
        return blk
    raise TypeError(f"not a part: {p!r}")


def to_blocks(msg: Message) -> list[Block]:
    """Return a message's blocks (its title a header block first)."""
    head = [header(msg.title)] if msg.title is not None else []
    return [*head, *(to_block(p) for p in msg.body)]


def fallback(msg: Message) -> str:
    """Return a message's top-level ``text`` (its fallback line, or its sections' text)."""
    if msg.fallback is not None:
        return clip(escape(msg.fallback), MAX_FALLBACK)
    return clip("\n".join(text_mrkdwn(s.text) for s in msg.sections), MAX_FALLBACK)


def to_slack(msg: Message) -> SlackMessage:
    return {"text": fallback(msg), "blocks": to_blocks(msg)}


def to_view(msg: Message) -> SlackMessage:
    """Return a page as a Home tab view."""
    return {"type": "home", "blocks": to_blocks(msg)}


class NeutralSurface:
    """A ``chat.surface.Surface`` in Slack: where one command's or click's messages go, each
    neutral message rendered on its way."""

    def __init__(
        self, api: SlackApi, *, channel: str | None, user: str, response_url: str | None
    ) -> None:
        self.api = api
        self.channel = channel
        self.user = user
        self.response_url = response_url

    async def reply(self, msg: Message) -> None:
        slack = to_slack(msg)
        await self.api.ephemeral(self.channel, self.user, slack, response_url=self.response_url)

    async def post(self, msg: Message, *, channel: str | None = None) -> MessageRef | None:
        target = channel or self.channel
        if target is None:
            await self.reply(msg)
            return None
        url = self.response_url if channel is None else None
        return await self.api.post(target, to_slack(msg), response_url=url)

    async def update(self, handle: MessageRef | None, msg: Message) -> MessageRef | None:
        if handle is None:
            return await self.post(msg)
        return await self.api.update(handle, to_slack(msg))
