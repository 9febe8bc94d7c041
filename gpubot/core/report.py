"""A report for the people who run gpubot, such as the work a stopped gpubot left unfinished."""

from __future__ import annotations

from dataclasses import dataclass

SHOWN = 10  # lines a report shows; the rest are counted


@dataclass(frozen=True)
class Report:
    """A titled report: a head line, its items (one line each), and where to see them all."""

    title: str
    head: str
    lines: tuple[str, ...]
    more: str = ""  # after "… and N more", e.g. " (`gpubot audit list`)"

    def text(self) -> str:
        """Return the head and at most ``SHOWN`` lines, then how many more there are."""
        shown = list(self.lines[:SHOWN])
        if len(self.lines) > SHOWN:
            shown.append(f"… and {len(self.lines) - SHOWN} more{self.more}")
        return self.head + ":\n" + "\n".join(shown)
