"""An approval's messages posted once: the alert outbox's rule, for approvals.

The request to on-call, the re-ping at half its expiry and the word to the requester at expiry
are each recorded first (``ApprovalPosts.begin``: a token, where it goes; at most one per
approval and purpose), then posted with the token in the message metadata, then marked posted.
A post whose answer is lost (a timeout, a 5xx, a crash) is looked for at once; not found, it
stays pending, and ``reconcile`` (the approval duty, every interval) settles it as
``AlertOutbox`` settles an alert's (``core.alerting.next_step``): found in the history, it is
adopted; provably absent, posted again with the same token; the history unreadable, posted once
more saying it may repeat; then given up on, with an audit record.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gpubot.core.alerting import Delivery, Handle, Lookup, Next, Posted, new_token, next_step
from gpubot.core.approval.posts import ApprovalPost, Purpose
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock

log = logging.getLogger(__name__)

SETTLE_S = 60.0  # a pending post younger than this may still be in flight: left alone

# Rebuilds the message of a pending post (None: nothing to say any more); the datetime, when
# given, is the post it may repeat.
Rebuild = Callable[[ApprovalPost, datetime | None], Awaitable[Any | None]]


class Poster(Protocol):
    """Posts a message carrying a token, and finds it again (Slack: ``slack.outbox``)."""

    async def post(self, post: ApprovalPost, msg: Any) -> Posted:
        """Post ``msg`` where ``post`` says, its token in the metadata; say how it ended."""
        ...

    async def find(self, post: ApprovalPost) -> Lookup:
        """Look for the message carrying ``post``'s token where it was to go."""
        ...

    async def direct(self, user: str) -> str | None:
        """Return the direct conversation with ``user`` (None: it cannot be opened)."""
        ...


class PostStore(Protocol):
    """The approval outbox's records (``store.approval_posts.ApprovalPosts``)."""

    async def begin(
        self, post: ApprovalPost, *, audit: Mapping[str, Any] | None = None
    ) -> ApprovalPost | None:
        """Record the intent of ``post``; None if it is not (or no longer) to be made."""
        ...

    async def finish(self, token: str, message_ts: str, now: datetime) -> None:
        """Record where the post is."""
        ...

    async def cancel(self, token: str, now: datetime) -> None:
        """Record that the post was refused."""
        ...

    async def note_repeat(self, token: str) -> None:
        """Record, before it is made, a post that may repeat an earlier one."""
        ...

    async def abandon(self, token: str, why: str, now: datetime) -> None:
        """Give up on the post (audited)."""
        ...

    async def pending(self, created_before: datetime) -> list[ApprovalPost]:
        """Return the posts not known to be posted or refused, recorded before a moment."""
        ...

    async def purposes(self, approval_id: int) -> set[Purpose]:
        """Return the purposes of the posts recorded for an approval."""
        ...


@dataclass
class ApprovalOutbox:
    """Posts an approval's messages through a ``Poster``, each once, with a ``PostStore``."""

    posts: PostStore
    poster: Poster
    clock: Clock = SYSTEM_CLOCK
    settle_s: float = SETTLE_S
    in_flight: set[str] = field(default_factory=set)  # tokens being posted by this process

    def now(self) -> datetime:
        """Return the clock's wall time as an aware datetime."""
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def intent(
        self, approval_id: int, purpose: Purpose, channel: str, thread_ts: str | None = None
    ) -> ApprovalPost:
        """Return a new post of ``purpose`` for an approval, to ``channel`` (in a thread)."""
        return ApprovalPost(new_token(), approval_id, purpose, channel, thread_ts, self.now())

    async def post(
        self, intent: ApprovalPost, msg: Any, *, audit: Mapping[str, Any] | None = None
    ) -> Handle | None:
        """Record, post and mark ``intent``; return where it landed (None: not recorded, since
        made or being made elsewhere; refused; or not confirmed yet)."""
        sent = await self.send(intent, msg, audit=audit)
        return None if sent is None else sent.handle

    async def send(
        self, intent: ApprovalPost, msg: Any, *, audit: Mapping[str, Any] | None = None
    ) -> Posted | None:
        """``post``, saying how it ended: None if it was not recorded (made, or being made,
        elsewhere); uncertain if Slack did not answer and the history does not show it yet."""
        pending = await self.posts.begin(intent, audit=audit)
        if pending is None:
            return None
        self.in_flight.add(pending.token)
        try:
            posted = await self._deliver(pending, msg)
            if posted.delivery is not Delivery.UNCERTAIN:
                return posted
            lookup = await self.poster.find(pending)
            if lookup.handle is None:
                log.warning(
                    "approval %s: %s post %s not confirmed (%s); looked for again later",
                    pending.approval_id,
                    pending.purpose,
                    pending.token,
                    lookup.why or "not there yet",
                )
                return posted
            await self.posts.finish(pending.token, lookup.handle[1], self.now())
            return Posted(Delivery.POSTED, lookup.handle)
        finally:
            self.in_flight.discard(pending.token)

    async def _deliver(self, pending: ApprovalPost, msg: Any) -> Posted:
        """Post, and record how it ended (an uncertain end stays pending)."""
        posted = await self.poster.post(pending, msg)
        if posted.delivery is Delivery.POSTED and posted.handle is not None:
            await self.posts.finish(pending.token, posted.handle[1], self.now())
            return posted
        if posted.delivery is Delivery.REFUSED:
            await self.posts.cancel(pending.token, self.now())
            return posted
        log.warning(
            "approval %s: %s post %s uncertain (%s)",
            pending.approval_id,
            pending.purpose,
            pending.token,
            posted.why,
        )
        return Posted(Delivery.UNCERTAIN, why=posted.why)

    async def reconcile(self, rebuild: Rebuild) -> int:
        """Settle every pending post old enough not to be in flight; return how many."""
        now = self.now()
        settled = 0
        for p in await self.posts.pending(now - timedelta(seconds=self.settle_s)):
            if p.token in self.in_flight:
                continue
            settled += 1
            await self._settle(p, rebuild)
        return settled

    async def _settle(self, p: ApprovalPost, rebuild: Rebuild) -> None:
        lookup = await self.poster.find(p)
        step = next_step(p, lookup)
        now = self.now()
        if step is Next.ADOPT and lookup.handle is not None:
            log.info("approval %s: %s post %s found, adopted", p.approval_id, p.purpose, p.token)
            await self.posts.finish(p.token, lookup.handle[1], now)
            return
        if step is Next.GIVE_UP:
            why = f"cannot tell whether it was posted: {lookup.why or 'history unreadable'}"
            log.error("approval %s: %s post given up: %s", p.approval_id, p.purpose, why)
            await self.posts.abandon(p.token, why, now)
            return
        msg = await rebuild(p, p.created_at if step is Next.REPEAT else None)
        if msg is None:
            await self.posts.abandon(p.token, "nothing to tell any more", now)
            return
        if step is Next.REPEAT:
            await self.posts.note_repeat(p.token)  # recorded before the post is made
        self.in_flight.add(p.token)
        try:
            await self._deliver(p, msg)
        finally:
            self.in_flight.discard(p.token)
