"""The console as the composition root builds on it (``app.front.FrontEnd``): what no command
asked for is printed through ``echo``; it has no directory, outbox or channel of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpubot.chat.message import Message
from gpubot.console.repl import TextSurface, echo, render
from gpubot.core.ports import Notifier, Report

if TYPE_CHECKING:
    from gpubot.chat.claims import Dm


class TextReporter:
    """Prints each report under its title with ``echo`` (the console's ``Reporter``)."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo

    async def report(self, report: Report) -> None:
        self.echo(f"━━ {report.title}\n{report.text()}")


@dataclass(frozen=True)
class ConsoleFront:
    """The console's outlets (what it is handed goes unread); ``notifier``: where sweep alerts
    go (the demo prints them), else nowhere."""

    echo: Callable[[str], None] = echo
    notifier: Notifier | None = None
    name: str = "console"
    min_update_s: float = 0.0  # a terminal shows each edit at once

    def surface(self) -> TextSurface:
        """Prints an expiry."""
        return TextSurface(self.echo)

    def reporter(self, settings: object) -> TextReporter:
        """Prints the start-up report."""
        return TextReporter(self.echo)

    def dm(self, outbox: object) -> Dm:
        """Prints a direct message, addressed."""

        async def dm(user: str, msg: Message, subject: str) -> bool:
            self.echo(f"(to @{user}) " + render(msg))
            return True

        return dm

    def alerts(self, settings: object, outbox: object, route: object) -> Notifier | None:
        """The notifier given, if any."""
        return self.notifier

    def directory(self) -> None:
        """None: the console knows no groups of people."""

    def poster(self) -> None:
        """None: nothing is posted once (a request is printed where it is asked)."""

    async def close(self) -> None:
        """Nothing to close."""
