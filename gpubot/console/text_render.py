"""Neutral messages (``gpubot.chat.message``) as terminal text: what the console prints.
Text a node user controls is one line (``one_line``): it can forge no line.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from gpubot.chat.layout import clip
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
from gpubot.core.text import TICK, TICK_STANDIN, one_line
from gpubot.core.text_table import table_lines

Typed = Callable[[Action], str | None]  # what to type for an action (None: nothing)


def date_text(d: Date) -> str:
    """Return a date as UTC text."""
    at = datetime.fromtimestamp(d.at, UTC)
    return at.strftime("%H:%M UTC" if d.style is DateStyle.TIME else "%Y-%m-%d %H:%M:%S UTC")


def span_text(s: Span) -> str:
    if isinstance(s, str):
        return one_line(s)
    if isinstance(s, Break):
        return "\n"
    if isinstance(s, Code):
        inner = one_line(s.text).replace(TICK, TICK_STANDIN)
        return f"`{inner}`" if inner else "–"
    if isinstance(s, Sentence):
        return one_line(s.text)
    if isinstance(s, Mention):
        return f"{s.name} (@{s.id})" if s.name else f"@{s.id}"
    if isinstance(s, Date):
        return date_text(s)
    if isinstance(s, Strong | Emph | Struck):
        return text_of(s.parts)
    if isinstance(s, Clipped):
        return clip(text_of(s.parts), s.most)
    if isinstance(s, Place):
        return "the alert's channel"
    raise TypeError(f"not a span: {s!r}")


def text_of(text: Text) -> str:
    return "".join(span_text(s) for s in text)


def action_text(a: Action, typed: Typed | None) -> str:
    """Return an action as ``[label]`` (and what to type for it, if anything)."""
    how = typed(a) if typed is not None else None
    return f"[{a.label}]" + (f" (type: {how})" if how else "")


def part_lines(p: Part, typed: Typed | None = None) -> list[str]:
    if isinstance(p, Heading):
        return [f"== {one_line(p.text)} =="]
    if isinstance(p, Section):
        out = text_of(p.text).split("\n")
        if p.accessory is not None:
            out.append("  " + action_text(p.accessory, typed))
        return out
    if isinstance(p, Pre):
        return [one_line(line) for line in p.lines]
    if isinstance(p, Table):  # the one text layout: the chat view's lines, else its rows
        if p.lines:
            return [one_line(line) for line in p.lines]
        return table_lines([[c or "–" for c in r] for r in p.rows], right=p.right)
    if isinstance(p, Context):
        return [" · ".join(t for t in (text_of(x) for x in p.parts) if t.strip())]
    if isinstance(p, Actions):
        return ["  ".join(action_text(a, typed) for a in p.actions)]
    raise TypeError(f"not a part: {p!r}")


def render_text(msg: Message, typed: Typed | None = None) -> str:
    """Return a message as text (its fallback line when it has no body)."""
    out = [f"== {one_line(msg.title)} =="] if msg.title is not None else []
    for p in msg.body:
        out.extend(part_lines(p, typed))
    if not out and msg.fallback:
        out = [one_line(msg.fallback)]
    return "\n".join(line for line in out if line.strip())
