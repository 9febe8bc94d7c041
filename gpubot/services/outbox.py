"""The one outbox: everything that must appear once (alerts, DMs, the audit head, the ladder's
posts, approvals' requests and re-pings) is recorded, posted, marked posted, and reconciled.

Posting first and recording after posts twice whenever the answer is lost: the bot killed while
the post is in flight, or the front end answering after the client's timeout a post it took. So
the intent comes first (``OutboxStore.begin``: a token, the subject, where it goes, and what it
changes, in one transaction); the post carries the token, unseen by people; where it landed is
recorded after. Every change after the intent is a compare-and-set on the caller's take, so of
two replicas only the one holding the row's take records anything.

A post whose end is unknown stays pending. Before anything is posted again, the history is
searched for its token (``Find``): found, it is adopted; provably absent, it is posted again
with the same token; if the history cannot be read, it is posted once more saying "this may
repeat the message of HH:MM" (``core.alerting.next_step``), then given up on, with an audit
record. An alert or an approval's post left so is settled by its duty (``reconcile``), which
takes each stale row first; a message (``publish``) settles its subject's earlier posts first;
a message due to any process, more than once (``publish_once``), is one row per subject, and a
caller that finds it refused, given up, or stale takes it over.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from gpubot.core.alerting import (
    AlertGroup,
    Delivery,
    Intent,
    Lookup,
    MessageRef,
    Next,
    PendingPost,
    Posted,
    new_token,
    next_step,
)
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import FindingKey
from gpubot.core.ports import Clock, Notifier, OutboxStore, Poster
from gpubot.errors import GpubotError

log = logging.getLogger(__name__)

M = TypeVar("M")
SETTLE_S = 60.0  # a pending post younger than this may still be in flight: left alone
ALERT = "alert:"  # the subjects of alerts' posts: "alert:<node or digest label>"

# Posts one message with the given token (the datetime: a post it may repeat).
Send = Callable[[str, datetime | None], Awaitable[Posted]]
# Searches the history of where a post went for its token, from a moment on.
Find = Callable[[str, datetime], Awaitable[Lookup]]
# How to post a pending post now (None: nothing to say any more), and how to look for it.
Rebuild = Callable[[PendingPost], Awaitable[tuple[Send | None, Find]]]
Mine = Callable[[PendingPost], Awaitable[bool]]  # whether a pending post is this caller's
# The keys an alert post alerted, and where it is (None: not there, or not known yet).
Settled = tuple[MessageRef | None, tuple[FindingKey, ...]]


@dataclass(eq=False)
class Outbox(Generic[M]):
    """Posts each message once with an ``OutboxStore`` (None: no database, so at most once)
    through a front end's ``Poster`` (or the caller's ``Send`` and ``Find``)."""

    store: OutboxStore | None
    poster: Poster[M] | None = None
    _: KW_ONLY
    clock: Clock = SYSTEM_CLOCK
    settle_s: float = SETTLE_S
    # tokens this process is posting: never taken here
    in_flight: set[str] = field(default_factory=set, init=False)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    @property
    def _store(self) -> OutboxStore:
        if self.store is None:
            raise GpubotError("this outbox has no database: it records nothing")
        return self.store

    @property
    def _poster(self) -> Poster[M]:
        if self.poster is None:
            raise GpubotError("this outbox has no front end to post with")
        return self.poster

    def calls(self, to: str, msg: M) -> tuple[Send, Find]:
        poster = self._poster

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            return await poster.post(to, msg, token=token, repeat_of=repeat_of)

        return send, self.finder(to)

    def finder(self, to: str) -> Find:
        poster = self._poster

        async def find(token: str, since: datetime) -> Lookup:
            return await poster.find(to, token, since)

        return find

    async def direct(self, user: str) -> str | None:
        return await self._poster.direct(user)

    # -- posts recorded with what they change: alerts, approvals ------------------------------

    async def post(self, intent: Intent, send: Send, find: Find) -> tuple[Posted, Settled] | None:
        """Record ``intent``, post, record how it ended; None if nothing was recorded (done,
        being done, or not due). A post whose answer was lost is looked for at once; not
        found, it stays pending (``Delivery.UNCERTAIN``) for ``reconcile``."""
        post = await self._store.begin(intent)
        return None if post is None else await self._make(post, send, find, intent.at)

    async def _make(
        self, post: PendingPost, send: Send, find: Find, at: datetime
    ) -> tuple[Posted, Settled]:
        self.in_flight.add(post.token)
        try:
            posted = await send(post.token, None)
            keys = await self._record(post, posted, at)
            if keys is not None:
                return posted, (posted.ref if posted.delivery is Delivery.POSTED else None, keys)
            lookup = await find(post.token, post.since)
            if lookup.ref is None:
                why = lookup.why or "not there yet"
                log.warning("%s: post %s not confirmed (%s)", post.subject, post.token, why)
                return posted, (None, ())
            return Posted(Delivery.POSTED, lookup.ref), await self._adopt(post, lookup.ref)
        finally:
            self.in_flight.discard(post.token)

    async def post_to(self, intent: Intent, msg: M) -> Posted | None:
        if intent.to is None:
            raise GpubotError(f"{intent.subject}: a post through the poster needs a destination")
        done = await self.post(intent, *self.calls(intent.to, msg))
        return None if done is None else done[0]

    async def post_alert(self, group: AlertGroup, notifier: Notifier) -> tuple[FindingKey, ...]:
        """Post the alert of ``group`` once; return the keys it is known to have alerted. The
        message carries only the findings its record marked: the others were alerted already."""
        keys = tuple(i.key for i in group.items)
        post = await self._store.begin(Intent(ALERT + group.node, group.at, keys=keys))
        if post is None:
            return ()
        items = tuple(i for i in group.items if i.key in post.keys)

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            shown = replace(group, items=items, repeat_of=repeat_of)
            return await notifier.post(shown, token=token)

        return (await self._make(post, send, notifier.find, group.at))[1][1]

    async def reconcile(
        self,
        subjects: str,
        rebuild: Rebuild,
        now: datetime,
        *,
        settle_s: float | None = None,
        gone: str = "nothing to tell any more",
        mine: Mine | None = None,
    ) -> list[Settled]:
        """Settle every pending post of the subjects under ``subjects`` taken at least
        ``settle_s`` ago (default: the outbox's; after a restart, a timeout): take it, then
        adopt, post, or give up (``gone``: why, when it has nothing to say any more).
        ``mine``: which of them are this caller's to settle (default: all), the others left
        untaken to theirs."""
        stale = now - timedelta(seconds=self.settle_s if settle_s is None else settle_s)
        done: list[Settled] = []
        for p in await self._store.pending(subjects, under=True):
            if p.token in self.in_flight or (mine is not None and not await mine(p)):
                continue
            post = await self._store.take(p.token, stale, now)
            if post is None:
                continue  # another replica took it, or it ended meanwhile
            send, find = await rebuild(post)
            self.in_flight.add(post.token)
            try:
                done.append(await self._settle(post, send, find, now, repeat=True, gone=gone))
            finally:
                self.in_flight.discard(post.token)
        return done

    async def reconcile_alerts(
        self,
        notifier: Notifier,
        group_of: Callable[[PendingPost], AlertGroup | None],
        now: datetime,
    ) -> tuple[FindingKey, ...]:
        """Settle every pending alert post (``group_of``: its message now, None: every
        finding of it cleared); return the keys alerted. The sweeps that call it hold the
        sweep's lock, so a pending alert post not in flight here is left by a poster gone."""

        async def rebuild(post: PendingPost) -> tuple[Send | None, Find]:
            group = group_of(post)
            if group is None:
                return None, notifier.find

            async def send(token: str, repeat_of: datetime | None) -> Posted:
                return await notifier.post(replace(group, repeat_of=repeat_of), token=token)

            return send, notifier.find

        done = await self.reconcile(ALERT, rebuild, now, settle_s=0.0, gone="its findings cleared")
        return tuple(k for _, keys in done for k in keys)

    # -- single messages: the audit head, DMs, the ladder's posts ---------------------------

    async def publish(
        self, subject: str, send: Send, find: Find, now: datetime, *, repeat: bool = False
    ) -> MessageRef | None:
        """Post one message of ``subject`` once; return where it is (None: refused, or not
        confirmed: it stays pending, and the next publication settles it first).

        ``repeat``: a message no later publication settles (a DM): when its post is uncertain
        and the history cannot be read, it is posted once more at once, saying it may repeat.
        """
        repeat_of = await self._supersede(subject, find, now)
        post = await self._store.begin(Intent(subject, now))
        if post is None:
            raise GpubotError(f"{subject}: its post was not recorded")
        posted = await send(post.token, repeat_of)
        if await self._record(post, posted, now) is not None:
            return posted.ref if posted.delivery is Delivery.POSTED else None
        ref, _ = await self._settle(post, send, find, now, repeat=repeat, repeat_of=repeat_of)
        return ref

    async def publish_once(
        self,
        subject: str,
        send: Send,
        find: Find,
        now: datetime,
        *,
        repeat: bool = True,
        audit: Mapping[str, Any] | None = None,
    ) -> bool | None:
        """Post the message of ``subject`` once, whichever process asks for it and however
        often. One left pending for ``settle_s`` is settled by the next caller (``_settle``;
        without ``repeat``, an unreadable history leaves it pending: never a second post on a
        guess). One refused, or given up, is tried again by the next caller (a DM that failed
        is not lost); one posted, never. ``audit``: recorded with its intent.

        Return True if it was posted or adopted now, None if it was posted before, False if
        it is not known to be there: refused, not confirmed, or being done elsewhere."""
        stale = now - timedelta(seconds=self.settle_s)
        intent = Intent(subject, now, once=True, retake_before=stale, audit=audit)
        post = await self._store.begin(intent)
        if post is None:  # posted, or being done: the latter leaves a row pending
            return False if await self._store.pending(subject) else None
        if post.fresh:
            posted = await send(post.token, None)
            if await self._record(post, posted, now) is not None:
                return posted.delivery is Delivery.POSTED
        ref, _ = await self._settle(post, send, find, now, repeat=repeat)
        return ref is not None

    async def send(self, subject: str, to: str, msg: M) -> MessageRef | None:
        """Post ``msg`` to ``to`` once under ``subject`` through the poster (a DM: ``publish``
        with ``repeat``); return where it is (None: refused, not confirmed, or the outbox
        could not be written: nothing posted). Without a database, at most once."""
        send, find = self.calls(to, msg)
        if self.store is None:
            return (await send(new_token(), None)).ref
        try:
            return await self.publish(subject, send, find, self.now(), repeat=True)
        except GpubotError as exc:  # the outbox cannot be written: nothing was posted
            log.error("the message %s was not sent: %s", subject, exc)
            return None

    async def send_once(self, subject: str, to: str, msg: M) -> bool:
        """Post ``msg`` of ``subject``, due to any process and maybe more than once, once in
        all (``publish_once``); return whether it is known to be there. False: the caller
        asks again on a later turn. Without a database, at most once: an uncertain post
        counts as there."""
        send, find = self.calls(to, msg)
        if self.store is None:
            return (await send(new_token(), None)).delivery is not Delivery.REFUSED
        try:
            return await self.publish_once(subject, send, find, self.now()) is not False
        except GpubotError as exc:  # the outbox cannot be written: nothing was posted
            log.error("the message %s was not sent (tried again later): %s", subject, exc)
            return False

    async def recorded(self, subject: str) -> bool:
        """Whether a post of the once-only ``subject`` was recorded (``begin`` is the check
        that counts)."""
        return await self._store.recorded(subject)

    # -- the rule -----------------------------------------------------------------------------

    async def _record(
        self, post: PendingPost, posted: Posted, at: datetime
    ) -> tuple[FindingKey, ...] | None:
        """Record how a post ended: the keys alerted, () if refused, None if nobody knows."""
        if posted.delivery is Delivery.POSTED and posted.ref is not None:
            return tuple(await self._store.finish(post, posted.ref, at))
        if posted.delivery is Delivery.REFUSED:
            await self._store.cancel(post, at)  # its duty or its next caller tries again
            return ()
        log.warning("%s: post %s uncertain (%s)", post.subject, post.token, posted.why)
        return None

    async def _adopt(self, post: PendingPost, ref: MessageRef) -> Settled:
        log.info("%s: post %s found, adopted", post.subject, post.token)
        return ref, tuple(await self._store.finish(post, ref, self.now(), adopted=True))

    async def _settle(
        self,
        post: PendingPost,
        send: Send | None,
        find: Find,
        now: datetime,
        *,
        repeat: bool,
        repeat_of: datetime | None = None,
        gone: str = "nothing to tell any more",
    ) -> Settled:
        """A post whose end is unknown: search the history for its token before anything is
        posted again; adopt it, post it again (same token), or (``repeat``) post once more
        saying it may repeat, then give up. Without ``repeat`` an unreadable history leaves it
        pending; without ``send`` (nothing to say any more) it is given up."""
        lookup = await find(post.token, post.since)
        step = next_step(post, lookup)
        if step is Next.ADOPT and lookup.ref is not None:
            return await self._adopt(post, lookup.ref)
        if step is not Next.POST and not repeat:
            log.warning("%s: post %s not confirmed: %s", post.subject, post.token, lookup.why)
            return None, ()
        if step is Next.GIVE_UP or send is None:
            why = gone
            if step is Next.GIVE_UP:
                why = f"cannot tell whether it was posted: {lookup.why or 'history unreadable'}"
            log.error("%s: post %s given up: %s", post.subject, post.token, why)
            await self._store.abandon(post, why, now)
            return None, ()
        if step is Next.REPEAT:
            log.warning(
                "%s: post %s unconfirmed (%s): once more", post.subject, post.token, lookup.why
            )
            await self._store.note_repeat(post.token)  # recorded before the post is made
            repeat_of = repeat_of or post.created_at
        posted = await send(post.token, repeat_of)  # provably not there: the same token
        keys = await self._record(post, posted, now)
        return (posted.ref if posted.delivery is Delivery.POSTED else None), keys or ()

    async def _supersede(self, subject: str, find: Find, now: datetime) -> datetime | None:
        """Settle ``subject``'s earlier posts whose end is unknown: adopt those found, give up
        the others (this publication takes their place); return when the earliest one that
        nobody could look for was made (this one then says it may repeat it)."""
        repeat_of: datetime | None = None
        for post in await self._store.pending(subject):
            lookup = await find(post.token, post.since)
            step = next_step(post, lookup)
            if step is Next.ADOPT and lookup.ref is not None:
                await self._adopt(post, lookup.ref)
                continue
            if step is not Next.POST and repeat_of is None:
                repeat_of = post.created_at
            why = "not there" if step is Next.POST else (lookup.why or "no history")
            await self._store.abandon(post, f"{why}: a newer post replaces it", now)
        return repeat_of
