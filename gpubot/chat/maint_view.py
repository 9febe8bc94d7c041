"""``/gpu maint``'s answers: a window planned, ended, or the list of those open or planned."""

from __future__ import annotations

import logging

from gpubot.chat.message import Message, Section, note, paragraph
from gpubot.core import maint as mc
from gpubot.core.policy import Person
from gpubot.errors import GpubotError, StoreError
from gpubot.services.maint import MaintService

log = logging.getLogger(__name__)


async def maint_answer(
    svc: MaintService | None,
    cmd: mc.MaintCommand,
    who: Person,
    source: str,
    now: float,
    text: str,
    *,
    on_call: bool | None = None,
) -> Message:
    """Open, end or list maintenance windows (``svc`` None: the audit store is unavailable;
    ``on_call`` True: the caller vouches that ``who`` may)."""
    if svc is None:
        raise StoreError("maintenance windows need the audit database, which is unavailable")
    if isinstance(cmd, mc.MaintOpen):
        w = await svc.open(who, cmd, source, text=text, on_call=on_call)
        return note(f"🛠 planned #{w.id}: {w.node} {w.shown(now)}. Claims into it are refused.")
    if isinstance(cmd, mc.MaintEnd):
        w = await svc.end(who, cmd, source, text=text, on_call=on_call)
        return note(f"✅ ended #{w.id}: {w.node} {w.shown(w.start)}")
    found = await svc.list(cmd.node)
    if not found:
        return note("No maintenance windows open or planned.")
    return Message(
        "Maintenance windows",
        (Section(paragraph("\n".join(f"#{w.id} {w.node}: {w.shown(now)}" for w in found))),),
    )


async def live_windows(svc: MaintService | None) -> list[mc.Window]:
    """The windows open or planned, for a page; none when they cannot be read (the page still
    shows the fleet)."""
    if svc is None:
        return []
    try:
        return await svc.list(None)
    except GpubotError as exc:
        log.warning("maintenance windows unavailable: %s", exc)
        return []
