"""The weekly GPU-hours digest (``[reports] digest = "mon 09:00"``), posted once per week.

The sweeps check it (under the sweep lock: one replica at a time), so it is posted within one
sweep interval of its time, once a week through the one outbox (``Outbox.publish_once``, the
period its subject). If the channel's history cannot be read after an uncertain post, it is not
posted again: never a second digest on a guess.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpubot.core.alerting import Lookup, Posted
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock
from gpubot.core.usage.hours import hour_of
from gpubot.core.usage.report import Digest, UsageReport, Window
from gpubot.errors import DUTY_TURN, StoreError
from gpubot.services.outbox import Outbox
from gpubot.services.usage import UsageService

log = logging.getLogger(__name__)

WEEK_S = 7 * 86400
GRACE_S = 86400  # a digest not posted within a day of its time (gpubot was down) is skipped


class DigestNotifier(Protocol):
    """Posts the digest carrying a token, and finds a post by its token (Slack)."""

    async def post(self, report: UsageReport, *, token: str) -> Posted: ...

    async def find(self, token: str, since: datetime) -> Lookup: ...


@dataclass(eq=False)
class DigestService:
    """Posts each week's digest once."""

    digest: Digest
    by: str
    usage: UsageService
    outbox: Outbox[Any]
    notifier: DigestNotifier
    _: KW_ONLY
    clock: Clock = SYSTEM_CLOCK

    async def run_due(self) -> str | None:
        """Post the digest due now unless it was (return its period once posted, else None)."""
        now = self.clock.now()
        period = self.digest.period(now)
        if now - self.digest.last_due(now) > GRACE_S:
            return None
        until = hour_of(self.digest.last_due(now))

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            report = await self.usage.report_of(Window(until - WEEK_S, until), self.by, now)
            return await self.notifier.post(report, token=token)

        at = datetime.fromtimestamp(now, UTC)
        audit = {"alert": "digest post", "period": period}  # ``audit list --kind digest``
        try:
            done = await self.outbox.publish_once(
                period, send, self.notifier.find, at, repeat=False, audit=audit
            )
        except StoreError as exc:
            log.warning("the weekly digest waits: %s", exc, extra=DUTY_TURN)
            return None
        return period if done else None
