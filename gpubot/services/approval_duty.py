"""The approval duty, run every interval on the app's one scheduler.

Each run, in order: settles the approvals' posts whose answer was lost (``Outbox.reconcile``);
pings on-call again in the request's thread once half an undecided request's time has gone (the
outbox row is the mark: once per request across restarts and replicas); (the caller) expires
the requests whose time is up; and looks again at approved actions that did not run to an end
(``look_again``; see ``approval_retry``), each told in its thread. What it says is the chat
layer's (``Words``).

Each front end's duty handles only the approvals that came from it (their ``source``): their
posts are in its rooms and their people its own, so two front ends serving one database (one
``gpubot serve`` each) never post into each other's, nor re-ping, expire or retry twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from gpubot.config.front_ends import names
from gpubot.core.alerting import Intent, Lookup, PendingPost, Posted
from gpubot.core.approval.model import Approval
from gpubot.core.approval.posts import PREFIX, Purpose, parse_subject, reping_due, subject
from gpubot.core.models import ApprovalState
from gpubot.core.policy import Policy
from gpubot.services.approval_retry import ApprovalRetry
from gpubot.services.approvals import ApprovalService
from gpubot.services.outbox import Find, Outbox, Send

log = logging.getLogger(__name__)

M = TypeVar("M")
M_co = TypeVar("M_co", covariant=True)


class Words(Protocol[M_co]):
    """What the duty says (``chat.approval_words.ApprovalWords``)."""

    def request(self, a: Approval) -> M_co:
        """The request to on-call, with its buttons."""
        ...

    def reping(self, a: Approval, who: Sequence[str]) -> M_co:
        """The re-ping in the request's thread, naming who was asked."""
        ...

    def expired(self, a: Approval) -> M_co:
        """The word to the requester of an expired request."""
        ...

    def told(self, purpose: Purpose, a: Approval) -> M_co | None:
        """The word of ``purpose`` about an approved action that did not run to an end."""
        ...


def asked(policy: Policy) -> tuple[str, ...]:
    """Return who decides forced kills, as configured: user ids, then user groups."""
    return (*policy.approvers, *policy.approver_groups)


class ApprovalDuty(Generic[M]):
    """Re-pings, tells and settles the approvals' posts (see the module's docstring)."""

    def __init__(
        self,
        approvals: ApprovalService,
        outbox: Outbox[M],
        words: Words[M],
        *,
        front: str,
        settled_s: float = 30.0,
    ) -> None:
        """``front``: the front end whose people ``outbox``'s poster reaches directly (an
        approval's ``source``): the only approvals this duty handles; ``settled_s``: see
        ``ApprovalRetry``."""
        self.approvals = approvals
        self.policy = approvals.policy
        self.outbox = outbox
        self.words = words
        self.front = front
        self.retry = ApprovalRetry(approvals, settled_s=settled_s, source=front)

    async def _message(self, post: PendingPost) -> M | None:
        """Return the message of a pending post as it should be now (None: nothing to say)."""
        about = parse_subject(post.subject)
        a = None if about is None else await self.approvals.approvals.get(about[0])
        if about is None or a is None:
            return None
        purpose, pending = about[1], a.state is ApprovalState.PENDING
        if purpose is Purpose.REQUEST:
            return self.words.request(a) if pending else None
        if purpose is Purpose.REPING:
            return self.words.reping(a, self._asked()) if pending else None
        if purpose is Purpose.EXPIRED:
            return self.words.expired(a) if a.state is ApprovalState.EXPIRED else None
        return self.words.told(purpose, a)

    async def _rebuild(self, post: PendingPost) -> tuple[Send | None, Find]:
        if post.to is None:  # nowhere to look: given up

            async def unknown(token: str, since: object) -> Lookup:
                return Lookup(False, why="no destination recorded")

            return None, unknown
        msg = await self._message(post)
        send, find = self.outbox.calls(post.to, msg) if msg is not None else (None, None)
        return send, find or self.outbox.finder(post.to)

    async def _mine(self, post: PendingPost) -> bool:
        """Whether ``post`` is about an approval of this front end (another's is its own)."""
        about = parse_subject(post.subject)
        a = None if about is None else await self.approvals.approvals.get(about[0])
        return a is not None and a.source == self.front

    async def settle(self) -> int:
        now = self.approvals.now()
        return len(await self.outbox.reconcile(PREFIX, self._rebuild, now, mine=self._mine))

    async def _post(self, a: Approval, purpose: Purpose, to: str, msg: M, **audit: object) -> bool:
        intent = Intent(subject(a.id, purpose), self.approvals.now(), to=to, once=True, audit=audit)
        posted = await self.outbox.post_to(intent, msg)
        return posted is not None and posted.ref is not None

    def _asked(self) -> tuple[str, ...]:
        """The approvers (and groups) that this front end's re-ping can name: its own."""
        return tuple(w for w in asked(self.policy) if names(self.front, w))

    async def reping(self) -> int:
        """Ping on-call again in the thread of each request half-way to expiry; return how
        many were pinged now."""
        now = self.approvals.now()
        pinged = 0
        for a in await self.approvals.approvals.pending(self.front):
            if not reping_due(a, now) or a.ref is None:
                continue
            if await self.outbox.recorded(subject(a.id, Purpose.REPING)):
                continue  # pinged already (a read; ``begin`` is the check that counts)
            who = self._asked()
            msg = self.words.reping(a, who)
            pinged += await self._post(
                a, Purpose.REPING, a.ref, msg, post="reping", reminded=list(who)
            )
        return pinged

    async def tell_requester(self, a: Approval, purpose: Purpose = Purpose.EXPIRED) -> bool:
        """Tell the requester of an expired (or interrupted) request, in a direct message;
        False if they cannot be told that way (not of this front end, or no DM opened)."""
        if a.source != self.front:
            return False
        to = await self.outbox.direct(a.requester)
        if to is None:
            return False
        msg = self.words.expired(a) if purpose is Purpose.EXPIRED else self.words.told(purpose, a)
        if msg is None:
            return False
        return await self._post(a, purpose, to, msg, post=str(purpose), told=a.requester)

    async def tell_thread(self, a: Approval, purpose: Purpose) -> bool:
        """Say ``purpose``'s word in the request's thread (in the approvals' channel if the
        request was never posted), naming the requester and the approver; once."""
        to = a.ref or self.policy.approval_channel
        msg = self.words.told(purpose, a)
        if to is None or msg is None:
            log.warning("approval %s: %s, not told in chat", a.id, purpose)
            return False
        told = [a.requester, a.decided_by]
        return await self._post(a, purpose, to, msg, post=str(purpose), told=told)

    async def look_again(self) -> list[Approval]:
        """Look again at approved actions that did not run to an end (the module's step 4);
        return those whose request message should show a new state."""
        changed: list[Approval] = []
        for a in await self.retry.interrupted():
            await self.tell_thread(a, Purpose.INTERRUPTED)
            await self.tell_requester(a, Purpose.INTERRUPTED_DM)
            changed.append(a)
        for a in await self.approvals.approvals.waiting(self.front):
            if await self.outbox.recorded(subject(a.id, Purpose.WAITING)):
                continue  # told already (``begin`` is the check that counts)
            if await self.tell_thread(a, Purpose.WAITING):
                changed.append(a)
        for a in await self.retry.retry():
            gave_up = isinstance(a.result, dict) and a.result.get("gave_up")
            await self.tell_thread(a, Purpose.GAVE_UP if gave_up else Purpose.RETRIED)
            changed.append(a)
        return changed

    async def announce(self, a: Approval, msg: M, to: str) -> Posted | None:
        """Post a new request to on-call through the outbox; say how it ended (None: it was
        not recorded)."""
        intent = Intent(subject(a.id, Purpose.REQUEST), self.approvals.now(), to=to, once=True)
        return await self.outbox.post_to(intent, msg)
