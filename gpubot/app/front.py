"""What the root asks of a chat front end. The entry that chose one passes it to ``build``, so
the root names no front end. Each method is called once, while the root builds; None: the
front end has no such thing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpubot.chat.claims import Dm
    from gpubot.chat.dm_route import DmRoute
    from gpubot.chat.message import Message
    from gpubot.chat.surface import Surface
    from gpubot.config import Settings
    from gpubot.core.ports import Notifier, Poster, Reporter
    from gpubot.services.directory import Directory
    from gpubot.services.outbox import Outbox


class Publisher(Protocol):
    """Publishes the audit log's head outside the database."""

    async def publish(self) -> object: ...


class FrontEnd(Protocol):
    """A chat front end, as the root builds on it."""

    @property
    def name(self) -> str:
        """Its flows' source, as the audit log names it."""

    @property
    def min_update_s(self) -> float:
        """The least time between two edits of one message."""

    def surface(self) -> Surface:
        """Where duties show what no command asked for (an approval's expiry)."""

    def reporter(self, settings: Settings) -> Reporter:
        """Where the start-up report of interrupted work goes."""

    def directory(self) -> Directory | None:
        """Who is in a group of people (approvers, teams)."""

    def dm(self, outbox: Outbox[Message]) -> Dm:
        """How the claims' duty tells one person (each once through ``outbox``)."""

    def poster(self) -> Poster[Message] | None:
        """What posts the messages that must appear once (the outbox's front end)."""

    def alerts(
        self, settings: Settings, outbox: Outbox[Message], route: DmRoute
    ) -> Notifier | None:
        """Where sweep alerts go; ``route``: how the DMs that ride on them reach the people
        of another front end."""

    async def close(self) -> None:
        """Close its connections."""
