"""Sweep alerts posted once: record the intent, post, mark posted; reconcile what is pending.

Posting first and recording after (what gpubot did) posts an alert twice whenever the answer is
lost: the bot killed while the post is in flight, or Slack answering after the client's timeout a
post it took. So the intent comes first: ``AlertStore.begin_post`` records a token, the node and
the findings, and marks them alerted, in one transaction; the post carries the token in its
message metadata; ``finish_post`` records where it landed. A post whose end is unknown stays
pending. Before anything is posted again, the channel's history is searched for its token
(``Notifier.find``, since the findings were first seen): found, the message is adopted; provably
absent, it is posted (the same token); if the history cannot be read, it is posted once more
saying "this may repeat the alert of HH:MM", and after that given up on, with an audit record.

Single messages that must appear once and alert no finding (the audit head's publications:
``slack.heads``; the direct messages of idle holders, the reclaim ladder and claims:
``slack.dm_outbox``) take the same road through ``AlertOutbox.publish``: each publication first
settles the earlier ones whose end is unknown (found: adopted; otherwise superseded by this one,
which says it may repeat one that nobody could check), records its intent, posts, and after an
uncertain post searches the history before it posts again. A message that any process may find
due, and more than once (a hold's DM, the claims' duty's, issue 34), takes ``publish_once``: its
token comes from its subject, so it is one row, recorded by whoever is first, posted once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta

from gpubot.core.alerting import (
    AlertGroup,
    Delivery,
    Handle,
    Lookup,
    Next,
    PendingPost,
    Posted,
    new_token,
    next_step,
)
from gpubot.core.findings import FindingKey
from gpubot.core.ports import AlertStore, Notifier

log = logging.getLogger(__name__)

SETTLE_S = 60.0  # a message post left pending this long is settled by the next one due

# Rebuilds the message of a pending post from the findings' state now (None: none is open);
# the datetime, when given, is the post it may repeat.
GroupOf = Callable[[PendingPost, datetime | None], AlertGroup | None]
# Posts one single message with the given token (the datetime: a post it may repeat).
Send = Callable[[str, datetime | None], Awaitable[Posted]]
# Searches the channel's history for the post carrying a token, from a moment on.
Find = Callable[[str, datetime], Awaitable[Lookup]]


def once_token(subject: str) -> str:
    """Return the token of the one message of ``subject`` (the same in every process, so the
    outbox's unique token makes its intent one row)."""
    return hashlib.sha256(subject.encode()).hexdigest()[:32]


class AlertOutbox:
    """Posts alert messages through a ``Notifier``, each once, with the ``AlertStore``'s outbox."""

    def __init__(self, alerts: AlertStore, notifier: Notifier | None = None) -> None:
        """``notifier``: where alerts go (none for an outbox of single messages only)."""
        self.alerts = alerts
        self.notifier = notifier

    @property
    def _to(self) -> Notifier:
        if self.notifier is None:
            raise RuntimeError("this outbox has no notifier: it posts no alert")
        return self.notifier

    async def post(self, group: AlertGroup) -> tuple[FindingKey, ...]:
        """Post the alert of ``group`` once; return the keys it is known to have alerted.

        A post whose answer was lost is looked for at once (Slack may have it): if it is not
        found, it stays pending for the next sweep's ``reconcile``.
        """
        now = group.at
        token = new_token()
        pending = await self.alerts.begin_post(token, group.node, [i.key for i in group.items], now)
        if pending is None:
            return ()  # every finding of it was alerted meanwhile (another replica, a retry)
        items = tuple(i for i in group.items if i.key in pending.keys)
        done = await self._deliver(pending, replace(group, items=items))
        if done is not None:
            return done
        lookup = await self._to.find(token, pending.since)
        if lookup.handle is None:
            log.warning(
                "alert on %s: post %s not confirmed (%s); the next sweep looks again",
                group.node,
                token,
                lookup.why or "not in the channel yet",
            )
            return ()
        return await self._adopt(pending, lookup.handle, now)

    async def reconcile(self, group_of: GroupOf, now: datetime) -> tuple[FindingKey, ...]:
        """Settle every pending post (after a restart, a timeout): adopt, post, or give up."""
        done: list[FindingKey] = []
        for pending in await self.alerts.pending_posts():
            done += await self._settle(pending, group_of, now)
        return tuple(done)

    async def _settle(
        self, pending: PendingPost, group_of: GroupOf, now: datetime
    ) -> tuple[FindingKey, ...]:
        lookup = await self._to.find(pending.token, pending.since)
        step = next_step(pending, lookup)
        if step is Next.ADOPT and lookup.handle is not None:
            return await self._adopt(pending, lookup.handle, now)
        if step is Next.GIVE_UP:
            why = f"cannot tell whether it was posted: {lookup.why or 'history unreadable'}"
            log.error("alert on %s (post %s) given up: %s", pending.node, pending.token, why)
            await self.alerts.abandon_post(pending.token, why, now, taken=pending.take)
            return ()
        repeat_of = pending.created_at if step is Next.REPEAT else None
        group = group_of(pending, repeat_of)
        if group is None:
            await self.alerts.abandon_post(
                pending.token, "its findings cleared", now, taken=pending.take
            )
            return ()
        if step is Next.REPEAT:
            log.warning(
                "alert on %s: history unreadable (%s); posting once, saying it may repeat",
                pending.node,
                lookup.why,
            )
            await self.alerts.note_repeat(pending.token)  # recorded before the post is made
        return await self._deliver(pending, group) or ()

    async def _deliver(
        self, pending: PendingPost, group: AlertGroup
    ) -> tuple[FindingKey, ...] | None:
        """Post; return the keys alerted, () if Slack refused it, None if nobody knows."""
        posted = await self._to.post(group, token=pending.token)
        return await self._ended(pending, posted, group.at)

    async def _ended(
        self, pending: PendingPost, posted: Posted, at: datetime
    ) -> tuple[FindingKey, ...] | None:
        """Record how a post ended: the keys alerted, () if refused, None if nobody knows."""
        if posted.delivery is Delivery.POSTED and posted.handle is not None:
            channel, ts = posted.handle
            return tuple(
                await self.alerts.finish_post(pending.token, channel, ts, at, taken=pending.take)
            )
        if posted.delivery is Delivery.REFUSED:
            await self.alerts.cancel_post(
                pending.token, at, taken=pending.take
            )  # the next sweep tries again
            return ()
        log.warning("post %s on %s uncertain (%s)", pending.token, pending.node, posted.why)
        return None

    async def _adopt(
        self, pending: PendingPost, where: tuple[str, str], now: datetime
    ) -> tuple[FindingKey, ...]:
        log.info("post %s on %s found in %s, adopted", pending.token, pending.node, where[0])
        return tuple(
            await self.alerts.finish_post(
                pending.token, *where, now, taken=pending.take, adopted=True
            )
        )

    # -- single messages that alert no finding (the audit head) --------------------------------

    async def publish(
        self, subject: str, send: Send, find: Find, now: datetime, *, repeat: bool = False
    ) -> Handle | None:
        """Post one message of ``subject`` once; return where it is (None: refused, or not
        confirmed: it stays pending, and the next publication settles it first).

        ``repeat``: a message no later publication settles (a DM): when its post is uncertain
        and the history cannot be read, it is posted once more at once, saying it may repeat.
        """
        repeat_of = await self._supersede(subject, find, now)
        pending = await self.alerts.begin_message(new_token(), subject, now)
        posted = await send(pending.token, repeat_of)
        if await self._ended(pending, posted, now) is not None:
            return posted.handle if posted.delivery is Delivery.POSTED else None
        return await self._confirm(pending, send, find, now, repeat_of, repeat=repeat)

    async def publish_once(
        self, subject: str, send: Send, find: Find, now: datetime, *, settle_s: float = SETTLE_S
    ) -> bool:
        """Post the message of ``subject`` once, whichever process (or replica, or run) asks
        for it and however often: its token is made from ``subject`` (``once_token``), and it
        is recorded only if nothing is. A post of it left pending for ``settle_s`` (its poster
        died, or the answer and the search both failed) is settled by the next caller: found,
        adopted; provably absent, posted again with its token; otherwise posted once more
        saying it may repeat, then given up. One refused, or given up, is tried again by the
        next caller (a DM that failed is not lost); one posted, never.

        Return whether it is known to be there: posted or adopted now, or posted before by
        anyone. False: refused, not confirmed, or being done elsewhere (ask again later)."""
        stale = now - timedelta(seconds=settle_s)
        got = await self.alerts.begin_once(once_token(subject), subject, now, stale)
        if got is None:  # posted, or being done: the latter leaves a row pending
            return not await self.alerts.pending_posts(subject)
        pending, fresh = got
        if fresh:
            posted = await send(pending.token, None)
            if await self._ended(pending, posted, now) is not None:
                return posted.delivery is Delivery.POSTED
        return await self._confirm(pending, send, find, now, None, repeat=True) is not None

    async def _confirm(
        self,
        pending: PendingPost,
        send: Send,
        find: Find,
        now: datetime,
        repeat_of: datetime | None,
        *,
        repeat: bool,
    ) -> Handle | None:
        """After a post whose end is unknown: search the history for its token before anything
        is posted again; adopt it, post it again (same token), or (``repeat``) post once more
        saying it may repeat. Without ``repeat`` an unreadable history leaves it pending."""
        lookup = await find(pending.token, pending.since)
        step = next_step(pending, lookup)
        if step is Next.ADOPT and lookup.handle is not None:
            await self._adopt(pending, lookup.handle, now)
            return lookup.handle
        if step is not Next.POST and not repeat:
            log.warning("%s post %s not confirmed: %s", pending.node, pending.token, lookup.why)
            return None
        if step is Next.GIVE_UP:
            why = f"cannot tell whether it was posted: {lookup.why or 'history unreadable'}"
            await self.alerts.abandon_post(pending.token, why, now, taken=pending.take)
            return None
        if step is Next.REPEAT:
            log.warning(
                "%s post %s unconfirmed (%s): once more", pending.node, pending.token, lookup.why
            )
            await self.alerts.note_repeat(pending.token)  # recorded before the post is made
            repeat_of = repeat_of or pending.created_at
        again = await send(pending.token, repeat_of)  # provably not there: the same token
        await self._ended(pending, again, now)
        return again.handle if again.delivery is Delivery.POSTED else None

    async def _supersede(self, subject: str, find: Find, now: datetime) -> datetime | None:
        """Settle ``subject``'s earlier posts whose end is unknown: adopt those found, give up
        the others (this publication takes their place); return when the earliest one that
        nobody could look for was made (this one then says it may repeat it)."""
        repeat_of: datetime | None = None
        for pending in await self.alerts.pending_posts(subject):
            lookup = await find(pending.token, pending.since)
            step = next_step(pending, lookup)
            if step is Next.ADOPT and lookup.handle is not None:
                await self._adopt(pending, lookup.handle, now)
                continue
            if step is not Next.POST and repeat_of is None:
                repeat_of = pending.created_at
            why = "not in the channel" if step is Next.POST else (lookup.why or "no history")
            await self.alerts.abandon_post(
                pending.token, f"{why}: a newer post replaces it", now, taken=pending.take
            )
        return repeat_of
