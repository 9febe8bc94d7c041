"""The audit store as the composition root hands it to services: the store while it opens
(the cold ``gpubot status``), and the stand-in when none could be opened (fail closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpubot.core.lease import Fence
from gpubot.core.ports import AuditStore
from gpubot.errors import StoreError


class OpeningStore:
    """The audit store while ``App.run`` opens it: a write waits until it is open; none is
    made when it could not be (that was warned)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._store: AuditStore | None = None

    def opened(self, store: AuditStore | None) -> None:
        """Take the opened store (None: unusable) and let the waiting writes go."""
        self._store = store
        self._open.set()

    async def _ready(self) -> AuditStore:
        await self._open.wait()
        return self._store if self._store is not None else NoStore()

    async def record_query(self, **query: Any) -> None:
        await self._open.wait()
        if self._store is not None:  # None: "not recorded" was said when it failed to open
            await self._store.record_query(**query)

    async def begin_action(self, **action: Any) -> int:
        return await (await self._ready()).begin_action(**action)

    async def record_event(
        self, action_id: int, event: Mapping[str, Any], *, fence: Fence | None = None
    ) -> None:
        await (await self._ready()).record_event(action_id, event, fence=fence)

    async def finish_action(self, action_id: int, **outcome: Any) -> None:
        await (await self._ready()).finish_action(action_id, **outcome)


class NoStore:
    """Stands in when no store could be opened: every action is refused (fail closed)."""

    async def begin_action(self, **_: object) -> int:
        raise StoreError("the audit log is unavailable; nothing was done")

    async def record_event(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def finish_action(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def record_query(self, **_: object) -> None:
        raise StoreError("the audit log is unavailable")
