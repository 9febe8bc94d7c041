"""How much one message holds: the limits every front end can show, and a ``Budget`` of parts.

The limits are the strictest front end's (Slack's Block Kit), so that every message fits
everywhere. Text is measured as that renderer writes it: ``&``, ``<`` and ``>`` as entities, a
control character as ``\\xNN``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.chat.message import Heading, Kind, Message, Part, Pre
from gpubot.core.text import cut, one_line

MAX_PARTS = 50
MAX_PAGE_PARTS = 100
MAX_TEXT = 3000
MAX_HEADER = 150
MAX_CONTEXT = 10
MAX_TABLE_ROWS = 100
MAX_TABLE_CELLS = 20
MAX_TABLE_CHARS = 10_000  # the whole table's cells
MAX_FALLBACK = 3900  # a message's fallback line
FEW_NODES = 3  # up to this many nodes, a fleet answer shows each node's GPUs in full
MAX_FLAGGED = 60  # flagged GPUs detailed in a fleet answer (the rest are counted)
_WIDE = {"&": 5, "<": 4, ">": 4}


def size(line: str) -> int:
    """Return how many characters ``line`` takes once written for the strictest front end."""
    text = one_line(line)
    return len(text) + sum(_WIDE.get(c, 1) - 1 for c in text if c in _WIDE)


clip = cut  # shorten text to at most n characters, marking the cut


def table_fits(rows: Sequence[Sequence[str]]) -> bool:
    """Whether rows fit one table (rows, cells and characters)."""
    return (
        0 < len(rows) <= MAX_TABLE_ROWS
        and all(0 < len(r) <= MAX_TABLE_CELLS for r in rows)
        and sum(len(c or "–") for r in rows for c in r) <= MAX_TABLE_CHARS
    )


def table_text(rows: Sequence[Sequence[str]]) -> list[str]:
    width = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def rows_of(rows: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(r) for r in rows)


class Budget:
    """Parts of one message, never more than ``limit``; ``reserve`` keeps room for a tail."""

    def __init__(self, limit: int = MAX_PARTS) -> None:
        self.limit = limit
        self.parts: list[Part] = []

    @property
    def room(self) -> int:
        return self.limit - len(self.parts)

    def add(self, part: Part) -> bool:
        """Add one part if there is room."""
        if self.room <= 0:
            return False
        self.parts.append(part)
        return True

    def message(self, fallback: str | None = None, *, kind: Kind = Kind.MESSAGE) -> Message:
        """Return the parts as a message: a leading heading is its title."""
        parts = self.parts
        if parts and isinstance(parts[0], Heading):
            return Message(parts[0].text, tuple(parts[1:]), fallback, kind)
        return Message(None, tuple(parts), fallback, kind)

    def add_pre(self, lines: Sequence[str], *, reserve: int = 0) -> int:
        """Pack lines into preformatted parts (each within ``MAX_TEXT``); return how many fit."""
        chunk: list[str] = []
        used = 8  # the fences
        done = 0
        for line in lines:
            line = _clip_size(line, MAX_TEXT - 10)
            n = size(line)
            if chunk and used + n + 1 > MAX_TEXT:
                if self.room <= reserve:
                    return done
                self.add(Pre(tuple(chunk)))
                done += len(chunk)
                chunk, used = [], 8
            chunk.append(line)
            used += n + 1
        if chunk and self.room > reserve:
            self.add(Pre(tuple(chunk)))
            done += len(chunk)
        return done


def _clip_size(line: str, most: int) -> str:
    """Shorten ``line`` until its ``size`` is at most ``most``."""
    if size(line) <= most:
        return line
    text = one_line(line)
    while text and size(text) > most - 1:
        text = text[: max(0, len(text) - max(1, size(text) - most + 1))]
    return text + "…"
