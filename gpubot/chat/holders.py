"""The flows of an alert's buttons, for every front end: *Snooze* a finding, *Free it*.

*Free it* is the asker's own ``/gpu reset NODE gpu N pid P``: the usual identity, permission and
approval rules decide, so someone else's process still needs on-call. Before that, the process
is looked up again: a pid that ended or was reused since the alert is never reset on the
alert's word.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpubot.chat.claims import holds
from gpubot.chat.errors import error_message
from gpubot.chat.flows import Flows
from gpubot.chat.layout import clip
from gpubot.chat.message import Date, Sentence, note
from gpubot.chat.surface import Surface
from gpubot.core import commands
from gpubot.core.health.kinds import parse_key
from gpubot.core.policy import Person
from gpubot.errors import GpubotError, UsageError

# Snooze the finding ``key_text`` for ``choice`` ("1h", "1d") ``by`` someone; return the alert
# as it now is (``SweepService.snooze``).
Snoozer = Callable[..., Awaitable[Any]]


async def snooze(snoozer: Snoozer, key: str, choice: str, *, by: str, out: Surface) -> None:
    """Snooze one finding (``by``: who, as the audit names them), and say until when."""
    try:
        alert = await snoozer(key, choice, by=by)
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    k, until = alert.key, alert.snoozed_until
    where = f"{k.node} GPU {k.gpu}" if k.gpu is not None else k.node
    when = () if until is None else (" until ", Date(until.timestamp()))
    await out.reply(note("🔕 ", where, ": ", k.kind, " snoozed", *when))


async def free_it(
    flows: Flows, value: str, who: Person, out: Surface, *, evidence: str | None = None
) -> None:
    """Free the GPU an idle holder (the finding ``value``) holds, as ``who``'s own reset;
    ``evidence`` (the reclaim ladder's) goes into the command and the approval request."""
    try:
        key = parse_key(value)
        pid_text, _, ticks = key.holder.partition(":")
        if key.gpu is None or not pid_text.isdigit() or not ticks.isdigit():
            raise UsageError("this button names no process to free")
        pid = int(pid_text)
        line = f"reset {key.node} gpu {key.gpu} pid {pid}"
        cmd = commands.parse(line)
        status = flows.svc.status
        if who.refused is None and not await holds(status, key.node, pid, int(ticks), key.gpu):
            gone = (
                f"✅ pid {pid} no longer holds {key.node} GPU {key.gpu} (it ended, "
                "or the pid is another process now): nothing to free."
            )
            await out.reply(note(gone))
            return
    except GpubotError as exc:
        await out.reply(error_message(exc))
        return
    if evidence is None:
        await flows.run(cmd, who, out, text=f"/gpu {line} (Free it)")
        return
    assert isinstance(cmd, commands.Reset)
    text = f"/gpu {line} (Free it, reclaim ladder: {evidence})"
    context = ("Idle evidence: ", Sentence(clip(evidence, 600)))
    await flows.reset(cmd, who, out, text=text, context=context)
