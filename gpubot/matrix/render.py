"""Neutral messages (``gpubot.chat.message``) as Matrix event content: an ``m.notice`` with an
HTML ``formatted_body`` and the same message as plain text in ``body`` (what clients without HTML
and notifications show). Text a node user controls is escaped and kept on one line: it can forge
neither markup nor a line.

Matrix has no buttons: an approval request says what to react or type, and carries its id in
``APPROVAL_KEY`` so a reaction on the bot's own event finds the request it decides.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from gpubot.chat import claim_view as claims
from gpubot.chat.alerts import SNOOZE_ACTION
from gpubot.chat.drain_view import ACTION_DRAIN_NODE
from gpubot.chat.idle import ACTION_FREE
from gpubot.chat.ladder import ACTION_KEEP, ACTION_ONCALL_FREE
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
from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_DENY, ACTION_RESET_GPU
from gpubot.core.text import one_line
from gpubot.core.text_table import table_lines
from gpubot.matrix.ids import USER

APPROVAL_KEY = "org.gpubot.approval"  # the approval id a request event is for
HTML = "org.matrix.custom.html"
APPROVE, DENY = "✅", "❌"  # the reactions that decide a request
PREFIX = "!gpu"  # what starts a command


def date_text(d: Date) -> str:
    at = datetime.fromtimestamp(d.at, UTC)
    return at.strftime("%H:%M UTC" if d.style is DateStyle.TIME else "%Y-%m-%d %H:%M:%S UTC")


def mention_html(m: Mention) -> str:
    """A user id as a pill (a matrix.to link, as clients make them); another id as text."""
    name = escape(one_line(m.name or m.id))
    if USER.fullmatch(m.id):
        return f'<a href="https://matrix.to/#/{escape(m.id)}">{name}</a>'
    return name


def place(p: Place, html: bool) -> str:
    """Another message of the bot's ("ROOM/EVENT") as a matrix.to link, else as words."""
    room, _, event = str(p.handle).partition("/")
    if not html or not event:
        return "the alert"
    return f'<a href="https://matrix.to/#/{quote(room)}/{quote(event)}">the alert</a>'


def inline(s: Span, html: bool) -> str:
    """Return one span as HTML (``html``) or plain text."""
    esc = escape if html else str
    if isinstance(s, str | Sentence):
        return esc(one_line(s if isinstance(s, str) else s.text))
    if isinstance(s, Break):
        return "<br>" if html else "\n"
    if isinstance(s, Code):
        inner = as_typed(one_line(s.text))
        return (f"<code>{escape(inner)}</code>" if html else f"`{inner}`") if inner else "–"
    if isinstance(s, Mention):
        if html:
            return mention_html(s)
        return f"{one_line(s.name)} ({one_line(s.id)})" if s.name else one_line(s.id)
    if isinstance(s, Date):
        return date_text(s)
    if isinstance(s, Strong | Emph | Struck):
        tag = {Strong: "strong", Emph: "em", Struck: "del"}[type(s)]
        inner = text(s.parts, html)
        return f"<{tag}>{inner}</{tag}>" if html else inner
    if isinstance(s, Clipped):
        return esc(clip(text(s.parts, False), s.most))
    if isinstance(s, Place):
        return place(s, html)
    raise TypeError(f"not a span: {s!r}")


def as_typed(code: str) -> str:
    """A ``/gpu …`` command a message quotes, as it is typed here (``!gpu …``)."""
    if code == "/gpu" or code.startswith("/gpu "):
        return PREFIX + code.removeprefix("/gpu")
    return code


def text(parts: Text, html: bool) -> str:
    return "".join(inline(s, html) for s in parts)


def typed(a: Action) -> str | None:
    """Return what to type for an action (None: nothing Matrix offers)."""
    if a.id == ACTION_APPROVE:
        return f"react {APPROVE} or type {PREFIX} approve {a.value}"
    if a.id == ACTION_DENY:
        return f"react {DENY} or type {PREFIX} deny {a.value}"
    if a.id == ACTION_RESET_GPU:
        node, _, gpu = a.value.rpartition(":")
        return f"{PREFIX} reset {node} gpu {gpu}"
    if a.id == ACTION_FREE:
        return f"{PREFIX} free {a.value}"
    if (snooze := SNOOZE_ACTION.match(a.id)) is not None:
        return f"{PREFIX} snooze {snooze[1]} {a.value}"
    if a.id == ACTION_KEEP:
        return f"{PREFIX} keep {a.value} because REASON"
    if a.id == ACTION_ONCALL_FREE:
        return f"{PREFIX} oncall-free {a.value}"
    if a.id == ACTION_DRAIN_NODE:
        node, _, reason = a.value.partition(" ")
        return f"{PREFIX} drain {node} because {reason}" if reason else f"{PREFIX} drain {node}"
    return claim_typed(a)


def claim_typed(a: Action) -> str | None:
    """What to type for a button of the claims' messages: the claims' own commands where one
    does what the button does (``take``, ``leave``, ``wait``, ``release``), else the typed
    buttons of ``matrix.typed`` (``keep claim ID``, and ``free KEY`` for an intruder)."""
    if a.id == claims.ACTION_TAKE:
        return f"{PREFIX} take {a.value}"
    if a.id == claims.ACTION_LEAVE:
        return f"{PREFIX} leave {a.value}"
    if a.id == claims.ACTION_JOIN:
        return f"{PREFIX} {a.value}"
    if a.id == claims.ACTION_KEEP:
        return f"{PREFIX} keep claim {a.value}"
    if a.id == claims.ACTION_RELEASE:
        _, node, gpu = [*a.value.split(" "), "", ""][:3]
        return f"{PREFIX} release {node} gpu {gpu}" if node and gpu else None
    if a.id == claims.ACTION_FREE_INTRUDER:
        return f"{PREFIX} free {a.value}"
    return None


def actions_line(actions: tuple[Action, ...], html: bool) -> str | None:
    said = [(a.label, how) for a in actions if (how := typed(a)) is not None]
    if not said:
        return None
    if html:
        return " · ".join(f"{escape(label)}: <code>{escape(how)}</code>" for label, how in said)
    return " · ".join(f"{label}: {how}" for label, how in said)


def table_html(t: Table) -> str:
    if not t.rows:
        return "<pre>" + escape("\n".join(one_line(line) for line in t.lines)) + "</pre>"
    head, *rows = t.rows
    th = "".join(f"<th>{escape(one_line(c))}</th>" for c in head)
    trs = "".join(
        "<tr>" + "".join(f"<td>{escape(one_line(c or '–'))}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def part(p: Part, html: bool) -> str | None:
    """Return one part as an HTML block or plain lines (None: nothing to show)."""
    if isinstance(p, Heading):
        return f"<h4>{escape(one_line(p.text))}</h4>" if html else f"== {one_line(p.text)} =="
    if isinstance(p, Section):
        out = text(p.text, html)
        how = None if p.accessory is None else actions_line((p.accessory,), html)
        if how is not None:
            out += ("<br>" if html else "\n") + how
        return f"<p>{out}</p>" if html else out
    if isinstance(p, Pre):
        lines = "\n".join(one_line(line) for line in p.lines)
        return f"<pre>{escape(lines)}</pre>" if html else lines
    if isinstance(p, Table):
        if html:
            return table_html(p)
        if p.lines:
            return "\n".join(one_line(line) for line in p.lines)
        return "\n".join(table_lines([[c or "–" for c in r] for r in p.rows], right=p.right))
    if isinstance(p, Context):
        said = " · ".join(t for t in (text(x, html) for x in p.parts) if t.strip())
        return f"<p><small>{said}</small></p>" if html else said
    if isinstance(p, Actions):
        line = actions_line(p.actions, html)
        return None if line is None else (f"<p>{line}</p>" if html else line)
    raise TypeError(f"not a part: {p!r}")


def render(msg: Message, html: bool) -> str:
    """Return the whole message as HTML or as plain text (its fallback when it has no body)."""
    title = None if msg.title is None else one_line(msg.title)
    out = [] if title is None else [f"<h3>{escape(title)}</h3>" if html else f"== {title} =="]
    out += [b for p in msg.body if (b := part(p, html)) is not None and b.strip()]
    if not out and msg.fallback:
        out = [escape(one_line(msg.fallback)) if html else one_line(msg.fallback)]
    return ("" if html else "\n").join(out)


def approval_of(msg: Message) -> int | None:
    """Return the approval id a request message offers to decide, if any."""
    for p in msg.body:
        for a in p.actions if isinstance(p, Actions) else ():
            if a.id == ACTION_APPROVE and a.value.isdigit():
                return int(a.value)
    return None


def to_matrix(msg: Message) -> dict[str, Any]:
    """Return ``msg`` as the content of an ``m.notice`` (a bot's answer: no bot answers it)."""
    content: dict[str, Any] = {
        "msgtype": "m.notice",
        "body": render(msg, False),
        "format": HTML,
        "formatted_body": render(msg, True),
    }
    approval = approval_of(msg)
    if approval is not None:
        content[APPROVAL_KEY] = approval
    return content


def edit_of(event_id: str, msg: Message) -> dict[str, Any]:
    """Return the content of an edit (``m.replace``) of ``event_id`` to show ``msg``."""
    new = to_matrix(msg)
    shown = {k: v for k, v in new.items() if k != APPROVAL_KEY}
    return {
        **shown,
        "body": "* " + new["body"],
        "m.new_content": shown,
        "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
    }
