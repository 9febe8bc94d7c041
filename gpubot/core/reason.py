"""Why someone asks: ``… because <reason>`` at the end of a command line.

Everything after the first word ``because`` is the reason, kept apart from the words that say
what to do, so a reason can never change what is signalled. It is made one line (white space,
newlines included, collapsed) and capped in length here; each renderer escapes it as any text a
person typed (a plain string of the neutral message model).
"""

from __future__ import annotations

import re

MAX_REASON = 200  # characters kept of a reason
KEYWORD = "because"
_BECAUSE = re.compile(rf"(?:^|\s){KEYWORD}(?:\s|$)", re.IGNORECASE)


def clean_reason(text: str | None) -> str | None:
    """Return ``text`` as one line of at most ``MAX_REASON`` characters (None if empty)."""
    if text is None:
        return None
    one = " ".join(text.split())
    if not one:
        return None
    return one if len(one) <= MAX_REASON else one[: MAX_REASON - 1] + "…"


def split_reason(text: str) -> tuple[str, str | None]:
    """Split a command line at the first word ``because``: the command, and the reason
    (None without ``because``; ``""`` when nothing follows it)."""
    m = _BECAUSE.search(text)
    if m is None:
        return text, None
    return text[: m.start()], clean_reason(text[m.end() :]) or ""
