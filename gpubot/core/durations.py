"""The one duration grammar of gpubot (settings, CLI flags, chat commands) and its one
formatter: the same text means the same time wherever it is typed, and what gpubot shows
reads back as what it meant.

Grammar: one or more parts, each a number (decimals allowed: ``1.5h``, ``.5d``; no sign, no
exponent) and a unit ``w d h m s``, largest first, each at most once, any case, spaces allowed
between parts: ``90s``, ``1h 30m``, ``1w2d``. ``bare=True`` also takes plain seconds where a
place always did (``--grace 30``). The total is capped at ``MAX_S`` (ten years): anything
longer is a typo, and ``datetime`` arithmetic on it would fail far from the input.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Literal

UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}  # largest first
_PEOPLE = {"d": 86400, "h": 3600, "min": 60}  # the people's form: no weeks, no seconds past 1m
MAX_S = 3650 * 86400.0  # ten years
# Stored times keep microseconds: a stretch of exactly a window or a delay, measured between
# two of them, may read a hair short. Comparisons with a window or delay allow this much.
TIME_SLACK_S = 0.001
ACCEPTED = (
    'a duration like "90s", "30m", "1h30m", "1.5h", "2d" or "1w2d" '
    "(units w, d, h, m, s, largest first, each at most once)"
)
_NUMBER = r"(?:[0-9]{1,9}(?:\.[0-9]{0,6})?|\.[0-9]{1,6})"
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]+)")
_BARE = re.compile(_NUMBER)
Form = Literal["exact", "minutes", "people"]


class DurationError(ValueError):
    """A text that is not a duration. ``expected`` says what would be, without the text, for
    callers that quote the text their own way (``bad duration '4x': expected …``)."""

    def __init__(self, expected: str, text: object) -> None:
        super().__init__(f"{expected}, got {text!r}")
        self.expected = expected
        self.text = text


def parse(text: str, *, positive: bool = True, bare: bool = False) -> float:
    """Return the seconds ``text`` names (``"1h30m"`` → 5400.0).

    ``positive`` (the default) refuses zero: a claim, an interval or a window of no length is
    a mistake; ``positive=False`` lets a caller that means "none" accept ``0s``. ``bare``
    also takes a plain number as seconds. Raise ``DurationError`` (a ``ValueError``) whose
    message is one line saying what is accepted.
    """
    if not isinstance(text, str):
        raise DurationError(f"expected {ACCEPTED}", text)
    total, pos, order = 0.0, 0, -1
    body = text.strip()
    units = list(UNITS)
    if bare and _BARE.fullmatch(body):
        total, pos = float(body), len(body)
    while pos < len(body):
        m = _PART.match(body, pos)
        unit = "" if m is None else m[2].lower()
        if m is None or unit not in UNITS or units.index(unit) <= order:
            raise DurationError(f"expected {ACCEPTED}", text)
        order = units.index(unit)
        total += float(m[1]) * UNITS[unit]
        pos = m.end()
    if not body:
        raise DurationError(f"expected {ACCEPTED}", text)
    if total > MAX_S:
        raise DurationError("expected a duration of at most ten years (3650d)", text)
    if positive and total <= 0:
        raise DurationError("expected a duration greater than zero", text)
    return total


def format(seconds: float, form: Form = "exact") -> str:
    """Return ``seconds`` as text, in one of three forms.

    ``exact``: whole seconds (rounded), every non-zero unit, in the grammar ``parse`` reads
    (``1h30m``, ``45s``, ``2d3h``, ``0s``), so ``parse(format(s)) == round(s)`` and what
    gpubot shows can be typed back. ``minutes``: the same, rounded down to whole minutes once
    past one (a claim's time left: stored times lose a hair). ``people``: the two largest
    units, rounded down, spaced (``45 s``, ``14 min``, ``2 h 5 min``, ``3 d 4 h``), for ages
    and evidence in messages and logs, where seconds would be noise.
    """
    s = seconds if math.isfinite(seconds) and seconds > 0 else 0
    people = form == "people"
    left = int(s) if people else round(s)
    if form == "minutes" and left >= 60:
        left -= left % 60
    units = (_PEOPLE if left >= 60 else {"s": 1}) if people else UNITS
    parts: list[str] = []
    for unit, size in units.items():
        n, left = divmod(left, size)
        if people and parts:  # the largest unit and, when not zero, the one below it
            return f"{parts[0]} {n} {unit}" if n else parts[0]
        if n:
            parts.append(f"{n} {unit}" if people else f"{n}{unit}")
    return "".join(parts) or ("0 s" if people else "0s")


def when(text: str, now: float, what: str) -> float:
    """Return the unix time a ``--since`` or ``--until`` names: a duration before ``now`` (what
    ``parse`` reads) or an ISO date or time (UTC unless it says; a trailing ``Z`` too). Raise
    ``ValueError``, one line naming ``what``. A moment before 1970 is 1970: nothing was recorded
    before it, so an early date means "everything"."""
    t = text.strip()
    if t[-1:].lower() in UNITS and not {"-", ":"} & set(t):  # no ISO text ends in a unit
        try:
            at = now - parse(t)
        except DurationError as exc:
            raise ValueError(f"bad {what} {text!r}: {exc.expected}") from None
    else:
        try:
            moment = datetime.fromisoformat(t.removesuffix("Z"))
        except ValueError:
            raise ValueError(
                f"bad {what} {text!r}: expected a duration ago (e.g. 7d, 1h30m) or a UTC date "
                "or time (e.g. 2026-11-25 or 2026-11-25T09:00)"
            ) from None
        at = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return max(at, 0.0)
