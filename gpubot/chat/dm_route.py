"""Direct messages to a person on the front end that reaches them (issue 39).

A gpubot process serves one front end, and the settings map a Linux user to people of several
(``U0ALICE`` and ``@alice:lab.example``). A direct message to a person this process's front end
reaches goes through its own ``Dm``; one to a person it does not reach is handed over, rendered,
through the database (``DmDueStore``), and the process whose front end reaches them posts it
(``deliver``, a duty) through the one outbox under the same subject: once, whichever process
made it. Without a database there is nobody to hand it to: it is not sent. One that no process
delivers within ``KEEP_S`` is stale (an offer's hold has lapsed by then): given up, logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpubot.chat.claims import Dm
from gpubot.chat.message import Message
from gpubot.chat.message_codec import decode, encode
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock, DmDueStore, DueDm
from gpubot.errors import DUTY_TURN, StoreError

log = logging.getLogger(__name__)

KEEP_S = 3600.0  # a message no serving front end delivered in this long is stale: given up
RETRY_S = 30.0  # a message that did not go out waits this long, doubled each time, to go again


class DmRoute:
    """The one ``Dm`` of a process: its front end's own, or handed over (``due``). ``takes``:
    whether it delivers what others handed over (a front end with ids of its own; the console,
    which reaches anyone, never takes another's)."""

    def __init__(
        self,
        own: Dm,
        reaches: Callable[[str], bool],
        due: DmDueStore | None,
        *,
        takes: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.own, self.reaches, self.due, self.clock = own, reaches, due, clock
        self.takes = takes
        self._later: dict[str, tuple[float, float]] = {}  # subject → (next try, wait after)

    async def __call__(self, user: str, msg: Message, subject: str) -> bool:
        """Send ``msg`` to ``user`` once under ``subject``; False: the caller asks again."""
        if self.reaches(user):
            return await self.own(user, msg, subject)
        if self.due is None:
            log.info("%s: no database to hand the DM to %s over: not sent", subject, user)
            return False
        try:
            body = encode(msg)
        except ValueError as exc:
            log.error("%s: the DM to %s cannot be handed over: %s", subject, user, exc)
            return False
        try:
            await self.due.hand(DueDm(subject, user, body, self.clock.now()))
        except StoreError as exc:  # the caller asks again; a one-off message is lost, logged
            log.warning("%s: the DM to %s was not handed over: %s", subject, user, exc)
            return False
        return True  # kept: the front end that reaches them posts it

    async def deliver(self) -> int:
        """Post the handed-over messages to people this front end reaches (each once, through
        ``own``; one that did not go out waits longer each time), give up those older than
        ``KEEP_S``; return how many were posted."""
        if self.due is None or not self.takes:
            return 0
        sent = 0
        try:
            kept = await self.due.due()
            subjects = {d.subject for d in kept}  # forget the waits of those gone
            self._later = {k: v for k, v in self._later.items() if k in subjects}
            for dm in kept:
                sent += await self._one(dm)
        except StoreError as exc:  # the next turn tries again
            log.warning("handed-over DMs not delivered: %s", exc, extra=DUTY_TURN)
        return sent

    async def _one(self, dm: DueDm) -> bool:
        assert self.due is not None
        now = self.clock.now()
        if now - dm.at > KEEP_S:
            log.error(
                "%s: no front end delivered the DM to %s in time: given up", dm.subject, dm.to
            )
            await self.due.done(dm.subject)
            return False
        if not self.reaches(dm.to) or now < self._later.get(dm.subject, (0.0, 0.0))[0]:
            return False  # another front end's, or not yet again
        try:
            ok = await self.own(dm.to, decode(dm.body), dm.subject)
        except ValueError as exc:  # perhaps a newer gpubot's: left to one that reads it, or to age
            log.error("%s: the DM handed over to %s is unreadable: %s", dm.subject, dm.to, exc)
            ok = False
        except Exception:  # a DM is a courtesy: the duty goes on, and tries it again
            log.exception("%s: the DM to %s failed", dm.subject, dm.to)
            ok = False
        if ok:
            self._later.pop(dm.subject, None)
            await self.due.done(dm.subject)
        else:
            wait = self._later.get(dm.subject, (0.0, RETRY_S / 2))[1] * 2
            self._later[dm.subject] = (now + wait, wait)
        return ok
