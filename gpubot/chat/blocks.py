"""Block Kit messages for GPU status: pure ``render_*() -> dict`` functions within Slack's limits.

A message is ``{"text": fallback, "blocks": [...]}``. Limits (checked by ``limit_problems``): 50
blocks a message (100 in the Home tab), 3000 characters a section text, 150 a header, 10 context
elements, one ``table`` block a message with at most 100 rows of at most 20 cells, and none in a
view (``limit_problems(..., view=True)``); confirmation dialogs are plain_text.

Text a node user controls (names, commands, paths, user names) reaches mrkdwn only through one
of four functions, whatever its place: ``escape`` (plain text), ``code`` (a code span),
``code_safe`` (a line of a preformatted block) and ``mrkdwn`` (a core sentence whose names core
marked with ``core.text.code``). Each writes ``&``, ``<`` and ``>`` as entities (Slack's one
documented escape), so no name can mention ``@channel`` or forge a link; lets no back-tick
through (a look-alike ``ˋ``), so no name can close a code span or a block; shows ``*``, ``_``
and ``~`` of plain text as look-alikes (Slack has no escape for them), so no name can format;
and writes newlines and other control characters ``\\xNN``, so no name can start a line of its
own. Plain-text objects (headers, table cells, dialogs) are one line too.

``message_text`` turns any message back into plain text: the console prints exactly that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpubot.core.text import TICK, TICK_STANDIN, one_line

Message = dict[str, Any]
Block = dict[str, Any]

MAX_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_TEXT = 3000
MAX_HEADER = 150
MAX_CONTEXT = 10
MAX_TABLE_ROWS = 100
MAX_TABLE_CELLS = 20
MAX_TABLE_CHARS = 10_000  # the whole table's cells, as for Slack's data tables
MAX_FALLBACK = 3900  # top-level ``text``: Slack truncates past 40 000 and advises 4 000
MAX_BUTTON = 75
MAX_VALUE = 2000
MAX_BLOCK_ID = 255
# A confirmation dialog's parts are all plain_text: title ≤ 100, text ≤ 300, buttons ≤ 30
# (Block Kit reference, "Confirmation dialog object":
# https://api.slack.com/reference/block-kit/composition-objects#confirm).
MAX_CONFIRM = {"title": 100, "text": 300, "confirm": 30, "deny": 30}
FEW_NODES = 3  # up to this many nodes, a fleet answer shows each node's GPUs in full
MAX_FLAGGED = 60  # flagged GPUs detailed in a fleet answer (the rest are counted)


# Slack: "&, < and > … must be replaced with HTML entities" in all mrkdwn
# (https://api.slack.com/reference/surfaces/formatting#escaping). It gives no escape for the
# formatting characters: plain text shows look-alikes instead (those of jsx-slack's <Escape>,
# yhatt/jsx-slack src/mrkdwn/escape.ts): ∗ U+2217, ˍ U+02CD, ∼ U+223C, ˋ U+02CB.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
LOOKALIKES = {"*": "\u2217", "_": "\u02cd", "~": "\u223c", TICK: TICK_STANDIN}
_PLAIN = str.maketrans({**_ENTITIES, **{k: v for k, v in LOOKALIKES.items() if k != "_"}})
# An underscore between two letters or digits can neither open nor close italics, and names are
# full of them (``train_llama``, ``gpu_node1``): only the others become look-alikes.
_EDGE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
_CODE = str.maketrans({**_ENTITIES, TICK: TICK_STANDIN})
SOFT_HYPHEN = "\u00ad"  # invisible: put before a leading ``&gt;``, it stops a block quote
# The console shows a name's own characters again, but keeps ˋ: it marks where a name ends.
_UNDO = str.maketrans({**{v: k for k, v in LOOKALIKES.items() if k != TICK}, SOFT_HYPHEN: None})


def escape(text: str) -> str:
    """Return text a node user may control as one line of plain mrkdwn that formats nothing."""
    out = _EDGE_UNDERSCORE.sub(LOOKALIKES["_"], one_line(text).translate(_PLAIN))
    return SOFT_HYPHEN + out if out.startswith("&gt;") else out


def escape_lines(text: str) -> str:
    """Return ``escape`` of each line of ``text`` (lines stay lines: for text gpubot wrote)."""
    return "\n".join(escape(line) for line in text.split("\n"))


def mrkdwn_lines(text: str) -> str:
    """Return ``mrkdwn`` of each line of ``text`` (lines stay lines: for text gpubot wrote)."""
    return "\n".join(mrkdwn(line) for line in text.split("\n"))


def code_safe(text: str) -> str:
    """Return text as one line for a code span or a preformatted block (no back-tick in it)."""
    return one_line(text).translate(_CODE)


def code(text: str) -> str:
    """Return text as a code span (``code_safe`` inside one pair of back-ticks); "–" if empty."""
    inner = code_safe(text)
    return f"`{inner}`" if inner else "–"


def mrkdwn(text: str) -> str:
    """Return a core sentence as one line of mrkdwn: each literal core marked
    (``core.text.code``) a code span, every other part plain text (``escape``).

    Each part is escaped for where it lands, so nothing formats whoever wrote the back-ticks: a
    stray back-tick of a name core did not mark at worst moves text into or out of a span. A
    newline (of a name core did not mark) is ``\\x0a``, as in ``escape``.
    """
    parts = one_line(text).split(TICK)
    if len(parts) % 2 == 0:  # an unmatched back-tick is text, not the start of a span
        parts[-2:] = [parts[-2] + TICK + parts[-1]]
    return "".join(code(p) if i % 2 else escape(p) for i, p in enumerate(parts))


def clip(text: str, n: int) -> str:
    """Shorten ``text`` to at most ``n`` characters, marking the cut."""
    return text if len(text) <= n else text[: max(0, n - 1)] + "…"


_ENTITY_TAIL = re.compile(r"&[a-z]*\Z")


def clip_mrkdwn(text: str, n: int) -> str:
    """Shorten inline mrkdwn (made by ``escape``, ``code``, ``mrkdwn``) to at most ``n``
    characters, marking the cut: never inside an entity, and a code span cut short is closed
    (escaped text holds back-ticks only as the spans' own)."""
    if len(text) <= n:
        return text
    cut = _ENTITY_TAIL.sub("", text[: max(0, n - 1)])
    if cut.count(TICK) % 2 == 0:
        return cut + "…"
    cut = _ENTITY_TAIL.sub("", cut[: max(0, n - 2)])  # room for the closing back-tick
    return cut + ("…" + TICK if cut.count(TICK) % 2 else "…")


def date(ts: float) -> str:
    """Return a Slack date token that shows local time, with a UTC fallback."""
    fallback = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"<!date^{int(ts)}^{{date_short_pretty}} {{time_secs}}|{fallback}>"


def header(text: str) -> Block:
    """Return a header block (plain text, clipped to 150)."""
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": clip(one_line(text), MAX_HEADER)},
    }


def section(mrkdwn: str) -> Block:
    """Return a section block (clipped to 3000)."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(mrkdwn, MAX_TEXT)}}


def context(*parts: str) -> Block:
    """Return a context block of up to 10 mrkdwn parts."""
    elements = [{"type": "mrkdwn", "text": clip(p, MAX_TEXT)} for p in parts if p]
    return {
        "type": "context",
        "elements": elements[:MAX_CONTEXT] or [{"type": "mrkdwn", "text": " "}],
    }


def pre(lines: Iterable[str]) -> str:
    """Return lines as a preformatted mrkdwn text (already escaped lines)."""
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
    """Return a confirmation dialog object: every part ``plain_text`` and clipped to its limit.

    Slack's reference gives ``title``, ``text``, ``confirm`` and ``deny`` as plain_text text
    objects (https://api.slack.com/reference/block-kit/composition-objects#confirm), so the
    text is raw, never mrkdwn: nothing in it is parsed (no mention, no link), and it is not
    HTML-escaped (a plain_text ``&amp;`` would show as such).
    """
    parts = {"title": title, "text": text, "confirm": confirm, "deny": deny}
    dialog: dict[str, Any] = {
        k: {"type": "plain_text", "text": clip(one_line(v), MAX_CONFIRM[k]) or "–"}
        for k, v in parts.items()
    }
    if style is not None:
        dialog["style"] = style
    return dialog


def table_fits(rows: Sequence[Sequence[str]]) -> bool:
    """Whether rows fit one table block (rows, cells and characters)."""
    return (
        0 < len(rows) <= MAX_TABLE_ROWS
        and all(0 < len(r) <= MAX_TABLE_CELLS for r in rows)
        and sum(len(c or "–") for r in rows for c in r) <= MAX_TABLE_CHARS
    )


class Budget:
    """Blocks of one message, never more than ``limit``; ``reserve`` keeps room for a tail."""

    def __init__(self, limit: int = MAX_BLOCKS) -> None:
        self.limit = limit
        self.blocks: list[Block] = []

    @property
    def room(self) -> int:
        """Return how many blocks can still be added."""
        return self.limit - len(self.blocks)

    def add(self, block: Block) -> bool:
        """Add one block if there is room."""
        if self.room <= 0:
            return False
        self.blocks.append(block)
        return True

    def add_pre(self, lines: Sequence[str], *, reserve: int = 0) -> int:
        """Pack lines into preformatted sections; return how many lines fit."""
        chunk: list[str] = []
        size = 8  # the fences
        done = 0
        for line in lines:
            line = clip(line, MAX_TEXT - 10)
            if chunk and size + len(line) + 1 > MAX_TEXT:
                if self.room <= reserve:
                    return done
                self.add(section(pre(chunk)))
                done += len(chunk)
                chunk, size = [], 8
            chunk.append(line)
            size += len(line) + 1
        if chunk and self.room > reserve:
            self.add(section(pre(chunk)))
            done += len(chunk)
        return done


def render_text(text: str, *, title: str | None = None) -> Message:
    """Render a short mrkdwn answer (usage errors, notices)."""
    blocks = [header(title)] if title else []
    return {"text": clip(text, MAX_FALLBACK), "blocks": [*blocks, section(text)]}


# --- limits and plain text -------------------------------------------------------------------


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


def limit_problems(
    message: Mapping[str, Any], *, max_blocks: int | None = None, view: bool = False
) -> list[str]:
    """Return every way ``message`` (or, ``view``, a Home tab view) breaks a Slack limit.

    A view holds up to 100 blocks and no ``table`` block at all, nested or not: Slack renders
    tables in messages only (https://docs.slack.dev/reference/block-kit/blocks, the
    "Surfaces" of each block; https://docs.slack.dev/reference/block-kit/blocks/table-block).
    """
    problems: list[str] = []
    blocks = message.get("blocks") or []
    if max_blocks is None:
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
    """Turn mrkdwn into plain text (for the console and text fallbacks)."""
    out = []
    for i, part in enumerate(mrkdwn.split("```")):
        if i % 2:  # inside a preformatted block
            out.append(part.strip("\n"))
            continue
        out.append(_unformat(part))
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


def table_text(rows: Sequence[Sequence[str]]) -> list[str]:
    """Return rows as aligned text columns."""
    width = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip() for r in rows]


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
        elif kind == "section":
            if "text" in blk:
                out.append(_plain(blk["text"]["text"]))
            out.extend(_plain(f["text"]) for f in blk.get("fields", []))
        elif kind == "context":
            out.append(" · ".join(_plain(e.get("text", "")) for e in blk["elements"]).strip())
        elif kind == "table":
            out.extend(table_text([[c["text"] for c in r] for r in blk["rows"]]))
        elif kind == "actions":
            out.append("  ".join(f"[{e['text']['text']}]" for e in blk["elements"]))
        elif kind == "divider":
            out.append("-" * 40)
    return "\n".join(line for line in out if line.strip())


def without_tables(message: Mapping[str, Any]) -> Message | None:
    """Return a copy with each table block turned into preformatted text; None if none."""
    blocks = list(message.get("blocks") or [])
    if not any(b.get("type") == "table" for b in blocks):
        return None
    out: list[Block] = []
    for blk in blocks:
        if blk.get("type") != "table":
            out.append(blk)
            continue
        lines = [
            code_safe(line) for line in table_text([[c["text"] for c in r] for r in blk["rows"]])
        ]
        chunk = Budget(MAX_BLOCKS)
        chunk.add_pre(lines)
        out.extend(chunk.blocks)
    if len(out) > MAX_BLOCKS:
        out = [*out[: MAX_BLOCKS - 1], context("… the rest did not fit in one message")]
    return {**message, "blocks": out}


def text_only(message: Mapping[str, Any]) -> Message:
    """Return a blocks-free copy of ``message`` carrying its content as text."""
    return {"text": clip(escape_lines(message_text(message)), MAX_FALLBACK)}
