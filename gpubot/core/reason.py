"""Why someone asks: ``… because <reason>`` at the end of a command line.

Everything after the first ``because`` is the reason, kept apart from the words that say what to
do, so it can never change what is signalled; it is made one line and capped here.

A reason that reads like a reset's options (``because hung pid 4242``) is refused: those words
would be dropped from the targets, and the reset would be wider than the one meant.
"""

from __future__ import annotations

import re

MAX_REASON = 200  # characters kept of a reason
KEYWORD = "because"
_BECAUSE = re.compile(rf"(?:^|\s){KEYWORD}(?:\s|$)", re.IGNORECASE)
# A reset's option and a value it would take: ``pid 42``, ``gpu=1,2``, ``--user alice``
# (``user`` in its written-out forms only: "the user asked" is a reason).
_OPTION = re.compile(
    r"(?:^|\s)(?:(?:--)?(?:gpus?|pids?|grace)(?:=|\s+)[0-9]|(?:--user\s+|user=)[a-z_])",
    re.IGNORECASE,
)


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


def option_in(reason: str) -> str | None:
    """Return the first words of ``reason`` that read like a reset's option (None: none)."""
    m = _OPTION.search(reason)
    if m is None:
        return None
    word, *rest = reason[m.start() :].split()
    value = rest[0] if rest and "=" not in word else ""
    return f"{word} {value}".strip()
