"""The chat system's directory of people, as the approvals service asks it (``Directory``)."""

from __future__ import annotations

from typing import Protocol

from gpubot.core.policy import ChatAccount


class Directory(Protocol):
    """What the service asks the chat system about people (Slack; nothing on the console)."""

    async def group_members(self, group_id: str) -> frozenset[str]:
        """Return the user ids in a user group; raise ``GpubotError`` when it cannot tell."""
        ...

    async def account(self, user_id: str) -> ChatAccount | None:
        """Return what the chat system says of an account (None: it keeps no directory)."""
        ...

    async def home_team(self) -> str | None:
        """Return the workspace gpubot is installed in; raise ``GpubotError`` if unknown."""
        ...


class NoDirectory:
    """A directory that knows nobody's groups or accounts (the console)."""

    async def group_members(self, group_id: str) -> frozenset[str]:
        return frozenset()

    async def account(self, user_id: str) -> ChatAccount | None:
        return None

    async def home_team(self) -> str | None:
        return None
