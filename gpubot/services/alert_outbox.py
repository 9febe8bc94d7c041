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
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from gpubot.core.alerting import AlertGroup, Delivery, Next, PendingPost, next_step
from gpubot.core.findings import FindingKey
from gpubot.core.ports import AlertStore, Notifier

log = logging.getLogger(__name__)

# Rebuilds the message of a pending post from the findings' state now (None: none is open);
# the datetime, when given, is the post it may repeat.
GroupOf = Callable[[PendingPost, datetime | None], AlertGroup | None]


def new_token() -> str:
    """Return a fresh client token for one alert post (it rides in the message metadata)."""
    return secrets.token_hex(16)


class AlertOutbox:
    """Posts alert messages through a ``Notifier``, each once, with the ``AlertStore``'s outbox."""

    def __init__(self, alerts: AlertStore, notifier: Notifier) -> None:
        self.alerts = alerts
        self.notifier = notifier

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
        lookup = await self.notifier.find(token, pending.since)
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
        lookup = await self.notifier.find(pending.token, pending.since)
        step = next_step(pending, lookup)
        if step is Next.ADOPT and lookup.handle is not None:
            return await self._adopt(pending, lookup.handle, now)
        if step is Next.GIVE_UP:
            why = f"cannot tell whether it was posted: {lookup.why or 'history unreadable'}"
            log.error("alert on %s (post %s) given up: %s", pending.node, pending.token, why)
            await self.alerts.abandon_post(pending.token, why, now)
            return ()
        repeat_of = pending.created_at if step is Next.REPEAT else None
        group = group_of(pending, repeat_of)
        if group is None:
            await self.alerts.abandon_post(pending.token, "its findings cleared", now)
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
        posted = await self.notifier.post(group, token=pending.token)
        if posted.delivery is Delivery.POSTED and posted.handle is not None:
            channel, ts = posted.handle
            return tuple(await self.alerts.finish_post(pending.token, channel, ts, group.at))
        if posted.delivery is Delivery.REFUSED:
            await self.alerts.cancel_post(pending.token, group.at)  # the next sweep tries again
            return ()
        log.warning("alert on %s: post %s uncertain (%s)", group.node, pending.token, posted.why)
        return None

    async def _adopt(
        self, pending: PendingPost, where: tuple[str, str], now: datetime
    ) -> tuple[FindingKey, ...]:
        log.info("alert on %s: post %s found in %s, adopted", pending.node, pending.token, where[0])
        return tuple(await self.alerts.finish_post(pending.token, *where, now, adopted=True))
