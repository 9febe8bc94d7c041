"""The claim store as the claims service sees it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gpubot.core.claims.rules import Claim, ClaimOutcome, ClaimRequest, Wait


class ClaimStore(Protocol):
    """Claims and the queue; every method raises ``StoreError`` when the database fails."""

    async def claim(self, req: ClaimRequest) -> ClaimOutcome:
        """Write the claim conditionally (one winner)."""

    async def extend(
        self, chat_id: str, scope: tuple[str | None, tuple[int, ...]], by_s: float, **kw: Any
    ) -> list[tuple[Claim, bool]]:
        """Extend active claims; each with whether a limit cut it."""

    async def release(
        self, chat_id: str | None, scope: tuple[str | None, tuple[int, ...]], **kw: Any
    ) -> list[Claim]: ...

    async def expire(self, now: float, source: str = "gpubot") -> list[Claim]: ...

    async def active(self, node: str | None = None) -> list[Claim]: ...

    async def get(self, claim_id: int) -> Claim | None: ...

    async def used_last(self, chat_id: str, node: str) -> dict[int, float]:
        """Return GPU → when the person last claimed it on ``node``."""

    async def advance_idle(
        self, updates: Sequence[tuple[int, float | None, float, float | None]]
    ) -> None: ...

    async def mark_idle_dm(self, claim_id: int, now: float) -> bool:
        """Record the Keep / Release question once."""

    async def tell_intruder(self, claim_id: int, key: str, now: float) -> bool:
        """Record telling the holder of an intruder once."""

    async def keep(self, claim_id: int, chat_id: str, now: float, source: str) -> Claim | None: ...

    async def add_wait(self, wait: Wait, source: str) -> Wait: ...

    async def waits(self, node: str | None = None) -> list[Wait]: ...

    async def get_wait(self, wait_id: int) -> Wait | None: ...

    async def leave(
        self, chat_id: str, wait_id: int | None, now: float, source: str
    ) -> list[Wait]: ...

    async def offer(
        self, wait_id: int, gpus: tuple[int, ...], hold_until: float, now: float
    ) -> Wait | None:
        """Hold GPUs for a place, once."""

    async def lapse(self, now: float) -> list[Wait]: ...

    async def told(self, wait_id: int, now: float) -> Wait | None:
        """Close a place whose person was told."""
