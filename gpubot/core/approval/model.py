"""An approval for a forced action, as the approvals store hands it out.

``ApprovalRequest`` is what was asked: a reset plan that kills other people's processes, or a
change of a Slurm node's state (``NodeChange``: a drain or resume asked by someone who is no
approver), and how to run it. It is typed here and turned
into JSON (and back) only inside ``gpubot.store``: the wire form stays with the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpubot.core.alerting import MessageRef
from gpubot.core.clock import steps_of
from gpubot.core.models import ApprovalState
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import DatabaseBehind, LockHeld, StoreError

if TYPE_CHECKING:
    from gpubot.core.ports import Clock

# What stops an approved action before anything goes out to the node, and passes by itself: the
# node's lease held by another (busy), the lease lost, the database down. ``ResetInterrupted``
# (something went out), a refused plan and an unreachable node (a person should look: it ends
# ``failed`` and is shown as before) are not among them.
NOT_YET = (LockHeld, StoreError)


@dataclass(frozen=True)
class ApprovalRequest:
    """An action waiting for a decision: the plan (a forced kill's ``ResetPlan``, or a Slurm
    ``NodeChange``), the command that asked for it, the grace a kill runs with (None: the
    default) and the Linux user the requester mapped to when asking (None: unknown; an approver
    of that user is refused)."""

    plan: ResetPlan | NodeChange
    command: str = ""
    grace_s: float | None = None
    requester_user: str | None = None

    @property
    def node(self) -> str:
        return self.plan.node

    @property
    def change(self) -> NodeChange | None:
        """Return the node change it asks for (None: a reset)."""
        return self.plan if isinstance(self.plan, NodeChange) else None


@dataclass(frozen=True)
class Approval:
    """One request to run a forced action, and its life."""

    id: int
    requester: str  # chat user id (or cli:<user>)
    requester_name: str
    source: str
    node: str
    request: ApprovalRequest
    state: ApprovalState
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_by_name: str | None
    decided_at: datetime | None
    finished_at: datetime | None
    result: Any  # decoded JSON given to mark_executed / mark_failed, or None
    ref: MessageRef | None  # its request message, as the front end that posted it names it
    taken_at: datetime | None = None  # when a retry last took it from waiting back to approved

    @property
    def plan(self) -> ResetPlan | NodeChange:
        return self.request.plan


def run_until(a: Approval, valid_s: float) -> datetime:
    """Return until when an approved action that could not run is retried: its approval is
    valid for ``valid_s`` (``[approvals] expiry_s``) from its decision, as a request is from
    its asking; past that the node may have changed too much to run what was approved."""
    return (a.decided_at or a.created_at) + timedelta(seconds=valid_s)


def run_now(clock: Clock, valid_s: float) -> datetime:
    """Return the time to judge ``run_until`` by: the later of the wall clock and, after a
    step back, the monotonic clock's (``Steps.latest_now``), so that a stepped clock never runs
    an approved kill past its validity (a forward step gives it up: it is told). Twice
    ``valid_s`` after a step back, whatever was approved before it has ended by either."""
    return datetime.fromtimestamp(steps_of(clock).latest_now(2 * valid_s), UTC)


def cannot_run(exc: BaseException) -> str | None:
    """Return why an approved action could not run yet, if ``exc`` is a failure that may pass
    with nothing sent to the node (so a retry runs exactly what was approved); else None."""
    if isinstance(exc, DatabaseBehind) or not isinstance(exc, NOT_YET):
        return None
    return str(exc) or type(exc).__name__


def stopped(exc: BaseException) -> bool:
    """Whether ``exc`` stopped an approved action from outside, not a failure of its own: a
    cancellation (gpubot stopping, its scheduler's stop wait over). What it had sent is not
    known to have ended (a SIGTERM with no SIGKILL and no verify), so it is never recorded as
    ``failed``, which nobody is told of: left ``approved``, the interrupted look (at start-up,
    and on each run of the approval duty) marks it ``incomplete`` and tells its thread and its
    requester once."""
    return isinstance(exc, asyncio.CancelledError)
