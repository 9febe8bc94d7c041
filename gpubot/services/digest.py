"""The weekly GPU-hours digest (``[reports] digest = "mon 09:00"``), posted once per week.

The sweeps check it (``SweepService``, under the sweep lock: one replica at a time, on the
scheduler's interval), so it is posted within one sweep interval of its time. Once a week,
through an outbox (``DigestStore``): the period's intent and token are recorded first (one
winner), the post carries the token (``DigestNotifier``), where it landed is recorded after. A
post whose end is unknown stays pending and is looked for in the channel's history before
anything is posted again; if the history cannot be read it is not posted again (at most once,
logged).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Protocol

from gpubot.core.alerting import Delivery, Lookup, Posted, new_token
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock
from gpubot.core.usage.hours import hour_of
from gpubot.core.usage.report import Digest, DigestPost, UsageReport, Window
from gpubot.errors import DUTY_TURN, StoreError
from gpubot.services.usage import UsageService

log = logging.getLogger(__name__)

WEEK_S = 7 * 86400
GRACE_S = 86400  # a digest not posted within a day of its time (gpubot was down) is skipped
IN_FLIGHT_S = 60.0  # a pending post younger than this may still be on its way (as approvals)


class DigestStore(Protocol):
    """The digest outbox (``store.digests.DbDigests``)."""

    async def get(self, period: str) -> DigestPost | None: ...

    async def begin(self, period: str, token: str, now: float) -> bool: ...

    async def finish(
        self, period: str, state: str, where: tuple[str, str] | None, now: float
    ) -> None: ...


class DigestNotifier(Protocol):
    """Posts the digest carrying a token, and finds a post by its token (Slack)."""

    async def post(self, report: UsageReport, *, token: str) -> Posted: ...

    async def find(self, token: str, since: datetime) -> Lookup: ...


class DigestService:
    """Posts each week's digest once."""

    def __init__(
        self,
        digest: Digest,
        by: str,
        usage: UsageService,
        store: DigestStore,
        notifier: DigestNotifier,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.digest = digest
        self.by = by
        self.usage = usage
        self.store = store
        self.notifier = notifier
        self.clock = clock

    async def run_due(self) -> str | None:
        """Post the digest due now unless it was (return its period once posted, else None)."""
        now = self.clock.now()
        period = self.digest.period(now)
        if now - self.digest.last_due(now) > GRACE_S:
            return None
        try:
            found = await self.store.get(period)
            if found is not None and found.state == "posted":
                return None
            if found is not None and found.state == "pending":
                if now - found.created_at < IN_FLIGHT_S:  # maybe still posting: not yet
                    return None
                return await self._settle(period, found, now)
            token = new_token()
            if not await self.store.begin(period, token, now):
                return None
            return await self._post(period, token, now)
        except StoreError as exc:
            log.warning("the weekly digest waits: %s", exc, extra=DUTY_TURN)
            return None

    async def _settle(self, period: str, pending: DigestPost, now: float) -> str | None:
        """A post whose end is unknown: adopt it if the channel has it, post it if provably
        not, else leave it (never a second digest on a guess)."""
        since = datetime.fromtimestamp(pending.created_at, UTC)
        lookup = await self.notifier.find(pending.token, since)
        if lookup.handle is not None:
            await self.store.finish(period, "posted", lookup.handle, now)
            return period
        if not lookup.checked:
            log.warning("weekly digest %s: not posted again, %s", period, lookup.why)
            return None
        return await self._post(period, pending.token, now)

    async def _post(self, period: str, token: str, now: float) -> str | None:
        due = self.digest.last_due(now)
        until = hour_of(due)
        report = await self.usage.report_of(Window(until - WEEK_S, until), self.by, now)
        posted = await self.notifier.post(report, token=token)
        if posted.delivery is Delivery.POSTED:
            await self.store.finish(period, "posted", posted.handle, now)
            return period
        if posted.delivery is Delivery.REFUSED:
            await self.store.finish(period, "refused", None, now)  # the next sweep tries again
            log.error("weekly digest %s refused: %s", period, posted.why)
        return None
