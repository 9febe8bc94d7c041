"""How core sentences mark a name: in back-ticks, one line, never holding a back-tick itself.

Core says things to people ("kills container `train` of Linux user `alice`") without knowing
where they are shown. Its one convention: a literal that a node user controls (a job, container,
pod, image, unit or user name, a cgroup path) is written by ``code``, so it stands in one pair of
back-ticks, on one line, and no back-tick inside it can close the pair early. A front end then
knows which parts of a sentence are such literals: ``slack.mrkdwn.mrkdwn`` makes each a Slack code
span and escapes the rest as plain text; a terminal prints the sentence as it is.

A back-tick in a name is shown as ``ˋ`` (U+02CB, modifier letter grave accent): Slack has no
escape for a back-tick inside a code span, and a look-alike keeps the name readable.
"""

from __future__ import annotations

TICK = "`"
TICK_STANDIN = "\u02cb"  # ˋ: what a back-tick inside a name is shown as


def code(text: str) -> str:
    """Return ``text`` as a marked literal: back-ticks around one printable line with none inside.

    Non-printable characters (newlines, tabs, bidi controls …) are written ``\\xNN`` as the probe
    writes them, so a name can never start a line of its own.
    """
    return TICK + one_line(text).replace(TICK, TICK_STANDIN) + TICK


def one_line(text: str) -> str:
    """Return ``text`` with each non-printable character as ``\\xNN`` (as ``printable`` does)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
