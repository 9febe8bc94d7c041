"""The one duration grammar of gpubot: settings, CLI flags and chat commands all parse with it.

Pure (standard library only). Five grammars once grew here side by side, and the same text
(``1h30m``) was a good ``report --since`` and a refused ``audit list --since``; one parser
and one formatter keep every place that takes or shows a duration saying the same thing.

Grammar: one or more parts, each a number and a unit, units ``w d h m s`` (weeks, days,
hours, minutes, seconds), largest first, each at most once, any case, spaces allowed between
parts: ``90s``, ``30m``, ``1h30m``, ``1h 30m``, ``2d``, ``1w2d``, ``1.5h``. A number may
have a decimal part (``1.5h``, ``0.5d``); no sign, no exponent. The total is capped at
``MAX_S`` (ten years): anything longer is a typo, and ``datetime`` arithmetic on it would
fail far from the input that caused it.
"""

from __future__ import annotations

import math
import re

UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}  # largest first
MAX_S = 3650 * 86400.0  # ten years
# Stored times keep microseconds: a stretch of exactly a window or a delay, measured between
# two of them, may read a hair short. Comparisons with a window or delay allow this much.
TIME_SLACK_S = 0.001
ACCEPTED = (
    'a duration like "90s", "30m", "1h30m", "1.5h", "2d" or "1w2d" '
    "(units w, d, h, m, s, largest first, each at most once)"
)
_PART = re.compile(r"\s*([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([a-zA-Z]+)")


class DurationError(ValueError):
    """A text that is not a duration. ``expected`` says what would be, without the text, for
    callers that quote the text their own way (``bad duration '4x': expected …``)."""

    def __init__(self, expected: str, text: object) -> None:
        super().__init__(f"{expected}, got {text!r}")
        self.expected = expected
        self.text = text


def parse(text: str, *, positive: bool = True) -> float:
    """Return the seconds ``text`` names (``"1h30m"`` → 5400.0).

    ``positive`` (the default) refuses zero: a claim, an interval or a window of no length is
    a mistake; ``positive=False`` lets a caller that means "none" accept ``0s``. Raise
    ``DurationError`` (a ``ValueError``) whose message is one line saying what is accepted.
    """
    if not isinstance(text, str):
        raise DurationError(f"expected {ACCEPTED}", text)
    total, pos, order = 0.0, 0, -1
    body = text.strip()
    units = list(UNITS)
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


def format(seconds: float) -> str:
    """Return ``seconds`` in the grammar ``parse`` reads: ``5400`` → ``1h30m``, ``45`` →
    ``45s``, ``183600`` → ``2d3h``, ``0`` → ``0s``.

    Whole seconds (rounded), every non-zero unit: exact, so ``parse(format(s)) == round(s)``
    and what gpubot shows can be typed back. Callers that want a coarser text for chat keep
    their own rounding and may pass the rounded value here.
    """
    s = round(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    parts: list[str] = []
    for unit, size in UNITS.items():
        n, s = divmod(s, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def human(seconds: float) -> str:
    """Return ``seconds`` for a person reading a message: its two largest units, rounded down,
    spaced (``45 s``, ``14 min``, ``2 h 5 min``, ``3 d 4 h``).

    The coarse twin of ``format``, for evidence and ages in chat and logs ("idle for 1 h 15
    min", "2 h old") where seconds would be noise; what a person types back is ``format``'s.
    """
    s = max(0, int(seconds)) if math.isfinite(seconds) else 0
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"
