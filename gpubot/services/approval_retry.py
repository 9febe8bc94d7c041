"""Approved means run or told (issue 34): the periodic look at approved actions that did not
run to an end, on every run of the approval duty (the app's one scheduler), not only at start.

- **Interrupted**: left ``approved`` by a gpubot that stopped mid-run (SIGKILL, a reboot). Its
  node lease outlives its holder by up to the lease's ttl, so a bot restarted within that time
  (the usual supervisor restart) finds the lease in force and the start-up look skips it, as if
  a live bot held it. This look comes again each run and marks it ``incomplete`` once the lease
  has lapsed (``ApprovalService.abandon_approved``); the caller tells its thread and requester.
- **Waiting**: approved, but it could not run yet (the node busy, its lease lost, the database
  down: ``core.approval.model.cannot_run``). Each look retries it (``waiting`` → ``approved``, which
  one try of one replica wins) while its approval is valid (``core.approval.model.run_until``); past
  that it ends ``failed``, and the caller tells why.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass

from gpubot.core.approval.model import Approval, run_now, run_until
from gpubot.core.models import ApprovalState
from gpubot.core.timefmt import iso
from gpubot.errors import ApprovalError, GpubotError, StoreError
from gpubot.services.approvals import ApprovalService

log = logging.getLogger(__name__)

RETRY_SOURCE = "retry"  # the audit records' source of a reset run by a retry


@dataclass(eq=False)
class ApprovalRetry:
    """Looks again at interrupted approvals, and retries the waiting ones (module docstring).

    ``settled_s``: an approval is looked at as interrupted only once decided, or taken back
    from waiting by a retry (``taken_at``), this long ago, so that one a replica has just
    approved or resumed and is about to lease is never taken for abandoned; the lease's ttl
    costs nothing, as a dead holder's lease lapses no sooner anyway.
    """

    approvals: ApprovalService
    _: KW_ONLY
    settled_s: float
    source: str | None = None  # only the approvals of this front end (None: every one)

    async def interrupted(self) -> list[Approval]:
        """Mark ``incomplete`` the approvals whose holder stopped and whose lease has lapsed;
        return them, and those the start-up look marked (each is marked once, so each is
        returned once)."""
        await self.approvals.abandon_approved(self.settled_s, self.source)
        found, self.approvals.abandoned = self.approvals.abandoned, []
        return found

    async def retry(self) -> list[Approval]:
        """Retry each waiting approval, or give it up once its time to run is over; return
        those that ended (``executed``, ``failed``) as they are now."""
        await self._record_waits()
        ended = [await self._one(a) for a in await self.approvals.approvals.waiting(self.source)]
        return [a for a in ended if a is not None]

    async def _one(self, a: Approval) -> Approval | None:
        store, expiry_s = self.approvals.approvals, self.approvals.policy.expiry_s
        until = run_until(a, expiry_s)
        if run_now(self.approvals.clock, expiry_s) >= until:  # by the wall and monotonic clocks
            why = (a.result or {}).get("error") or "it could not run"
            why = f"never ran while approved, until {iso(until)}: {why}"
            result = {"error": why, "gave_up": True}
            try:
                return await store.mark_failed(a.id, result, now=self.approvals.now())
            except ApprovalError:  # another replica took it meanwhile
                return None
        try:
            taken = await store.resume(a.id, now=self.approvals.now())
        except ApprovalError:  # another replica's try took it first
            return None
        try:
            await self.approvals.run_approved(taken, source=RETRY_SOURCE)
        except GpubotError as exc:  # recorded: waiting again, or failed
            log.info("approval %s: the retry did not run it: %s", a.id, exc)
        now = await store.get(a.id)
        return None if now is None or now.state is ApprovalState.WAITING else now

    async def _record_waits(self) -> None:
        """Record the waits the store could not take when they happened (the database was
        down): until then the interrupted look leaves those approvals alone."""
        unrecorded, store = self.approvals.unrecorded, self.approvals.approvals
        for aid, why in list(unrecorded.items()):
            try:
                await store.mark_waiting(aid, {"error": why}, now=self.approvals.now())
            except ApprovalError:  # it is not approved any more: nothing to record
                pass
            except StoreError as exc:
                log.info("approval %s: its wait is still not recorded: %s", aid, exc)
                continue
            unrecorded.pop(aid, None)
