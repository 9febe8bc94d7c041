"""Maintenance windows (issue 37): open, end and list them; on-call only, every change and
every refusal audited (``store.maint``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.maint import (
    MaintEnd,
    MaintOpen,
    MaintStore,
    ProcsAhead,
    Window,
    due_holders,
    nodes_due,
    starts_at,
)
from gpubot.core.policy import Person
from gpubot.core.ports import Clock
from gpubot.errors import GpubotError, UsageError
from gpubot.services.status import StatusService

log = logging.getLogger(__name__)
NOT_ON_CALL = "only on-call (the approvers) may open or end maintenance windows"
IsApprover = Callable[[Person], Awaitable[bool]]


class MaintService:
    """The ``maint`` commands of every front end."""

    def __init__(
        self,
        store: MaintStore,
        status: StatusService,
        is_approver: IsApprover,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.status = status
        self.is_approver = is_approver
        self.clock = clock

    async def _may(
        self, who: Person, node: str, asked: str, source: str, on_call: bool | None
    ) -> None:
        """Refuse (audited) one who is not on-call; ``on_call`` True: the caller vouches for it
        (the CLI's user holds the settings and the database)."""
        if not (on_call if on_call is not None else await self.is_approver(who)):
            await self.store.refused(node, by=who.id, source=source, asked=asked, why=NOT_ON_CALL)
            raise UsageError(NOT_ON_CALL)

    async def open(
        self, who: Person, cmd: MaintOpen, source: str, *, text: str, on_call: bool | None = None
    ) -> Window:
        node = self.status.node(cmd.node).name
        await self._may(who, node, text, source, on_call)
        now = self.clock.now()
        start = starts_at(cmd.start, now)
        return await self.store.open(
            node, start, cmd.length_s, cmd.reason, by=who.id, source=source, now=now
        )

    async def end(
        self, who: Person, cmd: MaintEnd, source: str, *, text: str, on_call: bool | None = None
    ) -> Window:
        node = self.status.node(cmd.node).name
        await self._may(who, node, text, source, on_call)
        return await self.store.end(node, by=who.id, source=source, now=self.clock.now())

    async def list(self, node: str | None) -> list[Window]:
        if node is not None:
            self.status.node(node)
        return await self.store.live(self.clock.now(), node)


async def holders_ahead(
    windows: list[Window],
    status: StatusService,
    chat_ids: Mapping[str, tuple[str, ...]],
    now: float,
    before_s: float,
) -> list[ProcsAhead]:
    """Return the people to tell that their processes run on a node whose window starts within
    ``before_s``: each such node read now; a node that does not answer is left
    out (told on a later turn). ``chat_ids``: Linux user → chat ids (``[users]``)."""
    held: list[tuple[str, str, int, int]] = []
    for name in nodes_due(windows, now, before_s):
        try:
            snap = await status.snapshot(status.node(name))
        except GpubotError as exc:
            log.warning("the holders on %s were not read for its maintenance: %s", name, exc)
            continue
        for p in snap.processes:
            held += [(name, chat, p.gpu_index, p.pid) for chat in chat_ids.get(p.user or "", ())]
    return due_holders(windows, held, now, before_s)
