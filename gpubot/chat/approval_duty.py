"""The approval duty, run every interval on the app's scheduler (``GpuBot.expire_once``).

Each run, in order:

1. settles the approval posts whose answer was lost (``ApprovalOutbox.reconcile``: adopted if
   found in the channel's history, else posted again, at most once "may repeat");
2. pings on-call again, in the request's thread, once half of an undecided request's time has
   gone, naming who was asked (``[approvals] approvers`` and ``usergroup``); the outbox row is
   the mark, so it happens once per request across restarts and replicas;
3. expires the requests whose time is up: their message says "Expired at HH:MM, nobody decided;
   nothing was done", and the requester is told in a direct message (through the outbox too).
4. looks again at approved actions that did not run to an end (``look_again``, issue 34): one
   interrupted by a gpubot that stopped is marked ``incomplete`` once its lease has lapsed, and
   its thread and requester are told; one that could not run yet (``waiting``) is told in its
   thread, retried while its approval is valid, and its thread told how it ended.

Without an outbox (the console) only 3 runs, and the requester's own message is updated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from gpubot.chat.approval_told import THREAD, render_interrupted_dm, render_waiting
from gpubot.chat.message import NL, Code, Date, DateStyle, Message, Person, Place, Section, Span
from gpubot.chat.message import ctx as context
from gpubot.chat.reset_view import render_approval_request
from gpubot.core.alerting import Posted
from gpubot.core.approval.model import Approval
from gpubot.core.approval.posts import ApprovalPost, Purpose, reping_due
from gpubot.core.models import ApprovalState
from gpubot.core.policy import Policy
from gpubot.services.approval_outbox import ApprovalOutbox
from gpubot.services.approval_retry import ApprovalRetry
from gpubot.services.approvals import ApprovalService, unix

log = logging.getLogger(__name__)


def asked(policy: Policy) -> tuple[str, ...]:
    """Return who decides forced kills, as configured: user ids, then user groups."""
    return (*policy.approvers, *policy.approver_groups)


def _gpus(a: Approval) -> str:
    return ", ".join(map(str, a.plan.gpus)) or "–"


def render_reping(a: Approval, who: Sequence[str]) -> Message:
    """Render the re-ping of an undecided request, in its thread: who was asked, and when it
    expires."""
    names: list[Span] = []
    for i, w in enumerate(who):
        names += [", ", Person(w)] if i else [Person(w)]
    text: tuple[Span, ...] = (
        f"⏰ Request #{a.id} (forced kill on {a.node} GPU {_gpus(a)}) is still undecided: half "
        "its time is gone and it expires at ",
        Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
        ".",
        NL,
        "Asked: ",
        *(names or ["nobody (no approvers configured)"]),
    )
    return Message(None, (Section(text),), f"Request #{a.id} on {a.node} is still undecided")


def render_expired_dm(a: Approval) -> Message:
    """Render what the requester is told when nobody decided their request in time."""
    text: list[Span] = [
        f"⌛ Your request #{a.id} (forced kill on {a.node} GPU {_gpus(a)}) expired at ",
        Date(unix(a.expires_at) or 0.0, DateStyle.TIME),
        ", nobody decided; nothing was done. If it is still needed, ask again: ",
        Code(f"/gpu reset {a.node} gpu {_gpus(a).replace(' ', '')}"),
        ".",
    ]
    if a.channel and a.message_ts:
        text += [" The request: ", Place((a.channel, a.message_ts)), "."]
    return Message(None, (Section(tuple(text)),), f"Request #{a.id} expired: nothing was done")


def may_repeat(msg: Message, of: datetime) -> Message:
    """Return ``msg`` saying, first, that it may repeat the post of ``of``."""
    note = context(("this may repeat the message of ", Date(of.timestamp(), DateStyle.TIME)))
    return replace(msg, body=(note, *msg.body))


class ApprovalDuty:
    """Re-pings, expires and settles the approvals' posts (see the module's docstring)."""

    def __init__(
        self,
        approvals: ApprovalService,
        policy: Policy,
        outbox: ApprovalOutbox | None,
        *,
        settled_s: float = 30.0,
    ) -> None:
        """``settled_s``: how long after its decision an approval may be taken for interrupted
        (the lease's ttl: ``ApprovalRetry``)."""
        self.approvals = approvals
        self.policy = policy
        self.outbox = outbox
        self.retry = ApprovalRetry(approvals, settled_s=settled_s)

    async def rebuild(self, post: ApprovalPost, repeat_of: datetime | None) -> Message | None:
        """Return the message of a pending post as it should be now (None: nothing to say)."""
        a = await self.approvals.approvals.get(post.approval_id)
        msg: Message | None = None
        if a is None:
            return None
        if post.purpose is Purpose.REQUEST and a.state is ApprovalState.PENDING:
            expires = unix(a.expires_at) or 0.0
            user = a.request.requester_user
            msg = render_approval_request(a.id, a.plan, a.requester, user, expires)
        elif post.purpose is Purpose.REPING and a.state is ApprovalState.PENDING:
            msg = render_reping(a, asked(self.policy))
        elif post.purpose is Purpose.EXPIRED and a.state is ApprovalState.EXPIRED:
            msg = render_expired_dm(a)
        else:
            msg = self._told(post.purpose, a)
        return msg if msg is None or repeat_of is None else may_repeat(msg, repeat_of)

    async def reping(self) -> int:
        """Ping on-call again in the thread of each request half-way to expiry; return how
        many were pinged now."""
        if self.outbox is None:
            return 0
        now = self.outbox.now()
        pinged = 0
        for a in await self.approvals.approvals.pending():
            if not reping_due(a, now) or a.channel is None or a.message_ts is None:
                continue
            if Purpose.REPING in await self.outbox.posts.purposes(a.id):
                continue  # pinged already (a read; ``begin`` is the check that counts)
            who = asked(self.policy)
            intent = self.outbox.intent(a.id, Purpose.REPING, a.channel, a.message_ts)
            audit = {"post": "reping", "reminded": list(who)}
            if await self.outbox.post(intent, render_reping(a, who), audit=audit) is not None:
                pinged += 1
        return pinged

    async def tell_requester(self, a: Approval, purpose: Purpose = Purpose.EXPIRED) -> bool:
        """Tell the requester of an expired (or interrupted) request, in a direct message;
        False if they cannot be told that way (not a Slack user, or no DM could be opened)."""
        if self.outbox is None or a.source != "slack":
            return False
        channel = await self.outbox.poster.direct(a.requester)
        if channel is None:
            return False
        intent = self.outbox.intent(a.id, purpose, channel)
        audit = {"post": str(purpose), "told": a.requester}
        msg = render_expired_dm(a) if purpose is Purpose.EXPIRED else render_interrupted_dm(a)
        return await self.outbox.post(intent, msg, audit=audit) is not None

    def _told(self, purpose: Purpose, a: Approval) -> Message | None:
        """Return the word of ``purpose`` about an approved action that did not run to an end
        (None: not one of those, or it has nothing to say now)."""
        if purpose is Purpose.INTERRUPTED_DM:
            return render_interrupted_dm(a)
        if purpose is Purpose.WAITING and a.state is ApprovalState.WAITING:
            return render_waiting(a, self.policy.expiry_s)
        render = THREAD.get(purpose)
        return None if render is None else render(a)

    async def tell_thread(self, a: Approval, purpose: Purpose) -> bool:
        """Say ``purpose``'s word in the request's thread (in the approvals' channel if the
        request was never posted), naming the requester and the approver; once."""
        channel = a.channel or self.policy.approval_channel
        msg = self._told(purpose, a)
        if self.outbox is None or channel is None or msg is None:
            log.warning("approval %s: %s, not told in chat", a.id, msg.fallback if msg else purpose)
            return False
        intent = self.outbox.intent(a.id, purpose, channel, a.message_ts)
        audit = {"post": str(purpose), "told": [a.requester, a.decided_by]}
        return await self.outbox.post(intent, msg, audit=audit) is not None

    async def look_again(self) -> list[Approval]:
        """Look again at approved actions that did not run to an end (the module's step 4);
        return those whose request message should show a new state."""
        changed: list[Approval] = []
        for a in await self.retry.interrupted():
            await self.tell_thread(a, Purpose.INTERRUPTED)
            await self.tell_requester(a, Purpose.INTERRUPTED_DM)
            changed.append(a)
        for a in await self.approvals.approvals.waiting():
            if self.outbox is not None and Purpose.WAITING in await self.outbox.posts.purposes(
                a.id
            ):
                continue  # told already (``begin`` is the check that counts)
            if await self.tell_thread(a, Purpose.WAITING):
                changed.append(a)
        for a in await self.retry.retry():
            gave_up = isinstance(a.result, dict) and a.result.get("gave_up")
            await self.tell_thread(a, Purpose.GAVE_UP if gave_up else Purpose.RETRIED)
            changed.append(a)
        return changed

    async def settle(self) -> int:
        """Settle the posts whose answer was lost; return how many were looked at."""
        return 0 if self.outbox is None else await self.outbox.reconcile(self.rebuild)

    async def announce(self, a: Approval, msg: Message, channel: str) -> Posted | None:
        """Post a new request to on-call through the outbox; say how it ended."""
        if self.outbox is None:
            return None
        intent = self.outbox.intent(a.id, Purpose.REQUEST, channel)
        return await self.outbox.send(intent, msg)


__all__ = ["ApprovalDuty", "asked", "may_repeat", "render_expired_dm", "render_reping"]
