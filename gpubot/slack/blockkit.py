"""Block Kit: the blocks gpubot sends, Slack's limits on them, and a message's plain text.

A message is ``{"text": fallback, "blocks": [...]}``. Limits (checked by ``limit_problems``): 50
blocks a message (100 in the Home tab), 3000 characters a section text, 150 a header, 10 context
elements, one ``table`` block a message with at most 100 rows of at most 20 cells, and none in a
view (``limit_problems(..., view=True)``); confirmation dialogs are plain_text.

``message_text`` turns a Block Kit message back into plain text: only for the last of Slack's
fallbacks, when Slack refuses a message's blocks (``simpler_forms``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from gpubot.chat.layout import (
    MAX_CONTEXT,
    MAX_FALLBACK,
    MAX_HEADER,
    MAX_TEXT,
    Budget,
    clip,
    table_fits,
    table_text,
)
from gpubot.chat.message import Pre
from gpubot.core.text import TICK, one_line
from gpubot.slack.mrkdwn import _UNDO, code_safe, escape_lines

SlackMessage = dict[str, Any]
Block = dict[str, Any]

MAX_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_BUTTON = 75
MAX_VALUE = 2000
MAX_BLOCK_ID = 255
# A confirmation dialog's parts are all plain_text: title ≤ 100, text ≤ 300, buttons ≤ 30
# (Block Kit reference, "Confirmation dialog object":
# https://api.slack.com/reference/block-kit/composition-objects#confirm).
MAX_CONFIRM = {"title": 100, "text": 300, "confirm": 30, "deny": 30}


def header(text: str) -> Block:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": clip(one_line(text), MAX_HEADER)},
    }


def section(mrkdwn: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(mrkdwn, MAX_TEXT)}}


def context(*parts: str) -> Block:
    """Return a context block of up to 10 mrkdwn parts (one blank part if none)."""
    elements = [{"type": "mrkdwn", "text": clip(p, MAX_TEXT)} for p in parts if p]
    return {
        "type": "context",
        "elements": elements[:MAX_CONTEXT] or [{"type": "mrkdwn", "text": " "}],
    }


def pre(lines: Iterable[str]) -> str:
    """Return already escaped lines as a preformatted mrkdwn text."""
    return "```\n" + "\n".join(lines) + "\n```"


def table(
    rows: Sequence[Sequence[str]], *, wrap: Sequence[int] = (), right: Sequence[int] = ()
) -> Block:
    """Return a ``table`` block; the first row is the header. Cells are raw text, one line."""
    width = max(len(r) for r in rows)
    settings = [
        {"is_wrapped": i in wrap, "align": "right" if i in right else "left"} for i in range(width)
    ]
    return {
        "type": "table",
        "column_settings": settings,
        "rows": [[{"type": "raw_text", "text": one_line(c) or "–"} for c in r] for r in rows],
    }


def confirm_dialog(
    title: str, text: str, *, confirm: str, deny: str, style: str | None = None
) -> dict[str, Any]:
    """Return a confirmation dialog object: every part ``plain_text`` (``MAX_CONFIRM``), so
    raw, never mrkdwn: nothing in it is parsed (no mention, no link), and it is not
    HTML-escaped (a plain_text ``&amp;`` would show as such)."""
    parts = {"title": title, "text": text, "confirm": confirm, "deny": deny}
    dialog: dict[str, Any] = {
        k: {"type": "plain_text", "text": clip(one_line(v), MAX_CONFIRM[k]) or "–"}
        for k, v in parts.items()
    }
    if style is not None:
        dialog["style"] = style
    return dialog


def nested(obj: Any) -> Iterable[Mapping[str, Any]]:
    """Yield every mapping inside ``obj`` (itself included), depth first."""
    if isinstance(obj, Mapping):
        yield obj
        for v in obj.values():
            yield from nested(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from nested(v)


def confirm_problems(blocks: Any) -> list[str]:
    """Return every way a confirmation dialog in ``blocks`` breaks Slack's rules."""
    problems = []
    for obj in nested(blocks):
        dialog = obj.get("confirm")
        if not isinstance(dialog, Mapping) or "title" not in dialog:
            continue  # not a dialog (a dialog's own "confirm" is a text object)
        for part, most in MAX_CONFIRM.items():
            t = dialog.get(part)
            if not isinstance(t, Mapping) or t.get("type") != "plain_text":
                problems.append(f"confirm dialog: {part} is not a plain_text object")
            elif not 0 < len(str(t.get("text", ""))) <= most:
                problems.append(f"confirm dialog: {part} not 1-{most} characters")
    return problems


def limit_problems(message: Mapping[str, Any], *, view: bool = False) -> list[str]:
    """Return every way ``message`` (or, ``view``, a Home tab view) breaks a Slack limit.

    A view holds up to 100 blocks and no ``table`` block at all, nested or not: Slack renders
    tables in messages only (https://docs.slack.dev/reference/block-kit/blocks, the
    "Surfaces" of each block; https://docs.slack.dev/reference/block-kit/blocks/table-block).
    """
    problems: list[str] = []
    blocks = message.get("blocks") or []
    max_blocks = MAX_VIEW_BLOCKS if view else MAX_BLOCKS
    if view and any(o.get("type") == "table" for o in nested(blocks)):
        problems.append("a table block in a view (tables render in messages only)")
    problems.extend(confirm_problems(blocks))
    if len(blocks) > max_blocks:
        problems.append(f"{len(blocks)} blocks > {max_blocks}")
    text = message.get("text", "")
    if len(text) > MAX_FALLBACK:
        problems.append(f"text of {len(text)} characters > {MAX_FALLBACK}")
    tables = 0
    for i, blk in enumerate(blocks):
        kind = blk.get("type")
        if len(blk.get("block_id", "")) > MAX_BLOCK_ID:
            problems.append(f"block {i}: block_id too long")
        if kind == "header" and len(blk["text"]["text"]) > MAX_HEADER:
            problems.append(f"block {i}: header > {MAX_HEADER}")
        if kind == "section":
            if "text" in blk and len(blk["text"]["text"]) > MAX_TEXT:
                problems.append(f"block {i}: section text > {MAX_TEXT}")
            if "text" in blk and not blk["text"]["text"]:
                problems.append(f"block {i}: empty section text")
            if len(blk.get("fields", [])) > 10:
                problems.append(f"block {i}: more than 10 fields")
        if kind == "context":
            els = blk.get("elements", [])
            if not 0 < len(els) <= MAX_CONTEXT:
                problems.append(f"block {i}: context has {len(els)} elements")
            if any(len(e.get("text", "")) > MAX_TEXT for e in els):
                problems.append(f"block {i}: context text > {MAX_TEXT}")
        if kind == "table":
            tables += 1
            rows = [[c["text"] for c in r] for r in blk["rows"]]
            if not table_fits(rows):
                problems.append(f"block {i}: table of {len(rows)} rows breaks a table limit")
            if any(not c for r in rows for c in r):
                problems.append(f"block {i}: empty table cell")
        if kind == "actions":
            for el in blk.get("elements", []):
                if len(el.get("text", {}).get("text", "")) > MAX_BUTTON:
                    problems.append(f"block {i}: button text > {MAX_BUTTON}")
                if len(el.get("value", "")) > MAX_VALUE:
                    problems.append(f"block {i}: button value > {MAX_VALUE}")
    if tables > 1:
        problems.append(f"{tables} table blocks (one a message)")
    return problems


_MENTION = re.compile(r"<[@#!]([^>|]+)(?:\|([^>]*))?>")
_LINK = re.compile(r"<(https?://[^>|]+)\|([^>]*)>")
_BOLD = re.compile(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])")


def _plain(mrkdwn: str) -> str:
    """Turn mrkdwn into plain text (for the text fallbacks)."""
    parts = mrkdwn.split("```")  # odd parts: inside a preformatted block
    out = [p.strip("\n") if i % 2 else _unformat(p) for i, p in enumerate(parts)]
    text = "\n".join(p for p in out if p.strip())
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return text.translate(_UNDO)  # the look-alikes of ``escape`` back to the real characters


def _unformat(text: str) -> str:
    """Drop our bold, links and mentions outside code spans (a span's text is shown as is)."""
    spans = text.split(TICK)
    for i in range(0, len(spans), 2):
        part = _LINK.sub(r"\2", spans[i])
        part = _MENTION.sub(lambda m: m.group(2) or ("@" + m.group(1).split("^")[0]), part)
        spans[i] = _BOLD.sub(r"\1", part)
    return TICK.join(spans)


def message_text(message: Mapping[str, Any]) -> str:
    """Render a message's blocks as plain text (its fallback when it has no blocks)."""
    blocks = message.get("blocks")
    if not blocks:
        return _plain(message.get("text", ""))
    out: list[str] = []
    for blk in blocks:
        kind = blk.get("type")
        if kind == "header":
            out.append(f"== {blk['text']['text']} ==")
        elif kind == "section":  # gpubot's have text, no fields; the last fallback never raises
            out.append(_plain(blk.get("text", {}).get("text", "")))
        elif kind == "context":
            out.append(" · ".join(_plain(e.get("text", "")) for e in blk["elements"]).strip())
        elif kind == "table":
            out.extend(table_text([[c["text"] for c in r] for r in blk["rows"]]))
        elif kind == "actions":
            out.append("  ".join(f"[{e['text']['text']}]" for e in blk["elements"]))
    return "\n".join(line for line in out if line.strip())


def without_tables(message: Mapping[str, Any]) -> SlackMessage | None:
    """Return a copy with each table block turned into preformatted text; None if none."""
    blocks = list(message.get("blocks") or [])
    if not any(b.get("type") == "table" for b in blocks):
        return None
    out: list[Block] = []
    for blk in blocks:
        if blk.get("type") != "table":
            out.append(blk)
            continue
        chunk = Budget(MAX_BLOCKS)
        chunk.add_pre(table_text([[c["text"] for c in r] for r in blk["rows"]]))
        out.extend(
            section(pre(code_safe(x) for x in p.lines)) for p in chunk.parts if isinstance(p, Pre)
        )
    if len(out) > MAX_BLOCKS:
        out = [*out[: MAX_BLOCKS - 1], context("… the rest did not fit in one message")]
    return {**message, "blocks": out}


def forms_with_blocks(msg: SlackMessage) -> Iterator[SlackMessage]:
    """Yield the forms with blocks to try in turn: ``msg``, then without tables (if it has one)."""
    if not msg.get("blocks"):
        return
    yield msg
    plain = without_tables(msg)
    if plain is not None:
        yield plain


def text_form(msg: SlackMessage) -> SlackMessage:
    """Return the last form to try: ``msg``'s content as text (as it is if it has no blocks)."""
    if not msg.get("blocks"):
        return {k: v for k, v in msg.items() if k != "blocks"}
    return {"text": clip(escape_lines(message_text(msg)), MAX_FALLBACK)}


def simpler_forms(msg: SlackMessage) -> Iterator[SlackMessage]:
    """Yield the forms to try in turn, each made when asked for: ``msg``, then without tables
    (if it has one), then text. A message without blocks is sent as it is (one try)."""
    yield from forms_with_blocks(msg)
    yield text_form(msg)
