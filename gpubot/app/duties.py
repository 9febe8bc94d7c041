"""Every periodic duty, built by the root and run by ``App.running``, the same in every front
end: a serving gpubot's sweep, audit seals and head; a front end's approvals, claims, and the
DMs other front ends' processes handed over to it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from gpubot.app.front import FrontEnd
from gpubot.app.services import Parts
from gpubot.chat.flows import Flows
from gpubot.chat.surface import Surface
from gpubot.config import Settings
from gpubot.core.ports import Clock
from gpubot.errors import DUTY_TURN, StoreError
from gpubot.lifecycle import Serving
from gpubot.scheduler import IntervalScheduler

log = logging.getLogger(__name__)

# How long a stop lets the approval duty's run end: a retried reset runs in it, and cancelled it
# ends with SIGTERM sent and no SIGKILL or verify (told as interrupted, but a person must check
# the node). It covers the default ``[reset]`` grace, the SIGKILL's wait and a verify, and stays
# under systemd's ``TimeoutStopSec``, whose SIGKILL would lose the clean stop's seal.
APPROVAL_STOP_WAIT_S = 60.0
STOP_S = 30.0  # the other duties' (a sweep waits for its budget)
DM_DUE_EVERY_S = 30.0  # how soon a DM handed over by another front end's process goes out
Job = Callable[[], Awaitable[object]]


def duties(
    parts: Parts,
    settings: Settings,
    serving: Serving | None,
    front: FrontEnd | None,
    clock: Clock,
) -> tuple[IntervalScheduler, ...]:
    """Return the schedules on ``clock``: the fleet's with ``serving``, and with a front end its
    own (run at once at start)."""
    # (name, every_s, job, first run after, how long a stop waits for the run under way)
    out: list[tuple[str, float, Job, float | None, float]] = []
    if serving is not None:
        first, cfg = serving.first_after_s, settings.sweep
        if serving.sweeps:
            out.append(("sweep", cfg.interval_s, parts.sweep.scheduled, first, cfg.budget_s))
        if parts.seals is not None:
            out.append(("audit-seal", parts.seals.every_s, parts.seals.periodic, first, STOP_S))
        every = settings.audit.publish_head_every_s
        if parts.heads is not None and every is not None:
            out.append(("audit-head", every, parts.heads.publish, first, STOP_S))
    if parts.flows is not None and front is not None:
        # Each front end's duty handles its own requests only (``services.approval_duty``).
        expire = expiry(parts.flows, front.surface())
        every = (serving or Serving()).expire_every_s
        out.append(("approval-expiry", every, expire, 0.0, APPROVAL_STOP_WAIT_S))
        out.append(("claims", settings.claims.every_s, parts.flows.claims.tick, 0.0, STOP_S))
    if parts.dms is not None and parts.dms.due is not None:  # DMs handed over to this front
        out.append(("dm-due", DM_DUE_EVERY_S, parts.dms.deliver, 0.0, STOP_S))
    return tuple(
        IntervalScheduler(
            job, every_s, first_after_s=first, stop_wait_s=wait, name=name, clock=clock
        )
        for name, every_s, job, first, wait in out
    )


def expiry(flows: Flows, surface: Surface) -> Callable[[], Awaitable[None]]:
    """Return the approval duty's job for ``flows``'s own approvals: expire the due ones (their
    messages updated on ``surface``), re-ping on-call, look again at approved work."""

    async def expire() -> None:
        try:
            await flows.expire(surface)
        except StoreError as exc:  # one line, no traceback; an outage's is said once (store)
            log.warning("approvals not expired: %s", exc, extra=DUTY_TURN)
        except Exception:
            log.exception("expiring approvals failed", extra=DUTY_TURN)

    return expire
