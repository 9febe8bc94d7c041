"""The terminal's ``Reporter``: a report (the start-up report of interrupted work) as text."""

from __future__ import annotations

from collections.abc import Callable

from gpubot.core.report import Report


class TextReporter:
    """Prints each report under its title with ``echo`` (the console's ``Reporter``)."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo

    async def report(self, report: Report) -> None:
        """Print the report."""
        self.echo(f"━━ {report.title}\n{report.text()}")
