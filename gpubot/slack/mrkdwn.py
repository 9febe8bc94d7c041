"""mrkdwn, Slack's markup: the escapes that keep text a node user controls from formatting.

Text a node user controls (names, commands, paths, user names) reaches mrkdwn only through one
of four functions, whatever its place: ``escape`` (plain text), ``code`` (a code span),
``code_safe`` (a line of a preformatted block) and ``mrkdwn`` (a core sentence whose names core
marked with ``core.text.code``). Each writes ``&``, ``<`` and ``>`` as entities (Slack's one
documented escape), so no name can mention ``@channel`` or forge a link; lets no back-tick
through (a look-alike ``ˋ``), so no name can close a code span or a block; shows ``*``, ``_``
and ``~`` of plain text as look-alikes (Slack has no escape for them), so no name can format;
and writes newlines and other control characters ``\\xNN``, so no name can start a line of its
own. Plain-text objects (headers, table cells, dialogs) are one line too.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gpubot.core.text import TICK, TICK_STANDIN, one_line

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


def code_safe(text: str) -> str:
    """Return text as one line for a code span or a preformatted block (no back-tick in it)."""
    return one_line(text).translate(_CODE)


def code(text: str) -> str:
    """Return text as a code span (``code_safe`` inside one pair of back-ticks); "–" if empty."""
    inner = code_safe(text)
    return f"`{inner}`" if inner else "–"


def mrkdwn(text: str) -> str:
    """Return a core sentence as one line of mrkdwn: each literal core marked
    (``core.text.code``) a code span, every other part plain text (``escape``). Each part is
    escaped for where it lands: a stray back-tick of a name core did not mark at worst moves
    text into or out of a span, and formats nothing."""
    parts = one_line(text).split(TICK)
    if len(parts) % 2 == 0:  # an unmatched back-tick is text, not the start of a span
        parts[-2:] = [parts[-2] + TICK + parts[-1]]
    return "".join(code(p) if i % 2 else escape(p) for i, p in enumerate(parts))


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


def time_of_day(ts: float) -> str:
    """Return a Slack date token that shows the local hour and minute (UTC fallback)."""
    hhmm = datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")
    return f"<!date^{int(ts)}^{{time}}|{hhmm}>"
