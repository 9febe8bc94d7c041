"""How core sentences mark a name: in back-ticks, one line, never holding a back-tick itself.

Core speaks to people without knowing where its words are shown. A literal a node user controls
(a job, container, user name, cgroup path) is written by ``code``: one pair of back-ticks, one
line, no back-tick inside to close it early, so a front end knows which parts are literals.

A back-tick in a name is shown as ``ˋ`` (U+02CB): Slack has no escape for a back-tick inside a
code span, and a look-alike keeps the name readable.
"""

from __future__ import annotations

TICK = "`"
TICK_STANDIN = "\u02cb"  # ˋ: what a back-tick inside a name is shown as


def code(text: str) -> str:
    """Return ``text`` as a marked literal; non-printable characters become ``\\xNN``, so a
    name can never start a line of its own."""
    return TICK + one_line(text).replace(TICK, TICK_STANDIN) + TICK


def one_line(text: str) -> str:
    """Return ``text`` with each non-printable character as ``\\xNN`` (as ``printable`` does)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def cut(text: str, most: int) -> str:
    """Return ``text`` cut to ``most`` characters at its end, the cut marked ``…``."""
    return text if len(text) <= most else text[: max(0, most - 1)] + "…"
