"""The messages an approval sends that must appear once: its request to on-call, the re-ping at
half its expiry, the word to the requester when it expired unanswered, and the word in its
thread (and to the requester) when an approved action was interrupted, could not run yet, never
could, or ran on a retry.

Each is recorded (``ApprovalPost``: a token, where it goes) before it is posted, one per approval
and purpose, so that neither a restart nor a second replica posts it again; a post whose answer
was lost is settled by ``core.alerting.next_step``, as an alert's is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpubot.core.approval.model import Approval
from gpubot.core.models import ApprovalState


class Purpose(StrEnum):
    """Why an approval posts a message."""

    REQUEST = "request"  # the request with its buttons, in the on-call channel
    REPING = "reping"  # nobody decided by half its expiry: on-call is pinged in its thread
    EXPIRED = "expired"  # nobody decided at all: the requester is told, directly
    INTERRUPTED = "interrupted"  # gpubot stopped while running it: told in its thread
    INTERRUPTED_DM = "interrupted-dm"  # … and to the requester, directly
    WAITING = "waiting"  # approved, but it could not run yet: why, in its thread
    GAVE_UP = "gave-up"  # it never could run while its approval was valid: in its thread
    RETRIED = "retried"  # it ran on a retry: how it ended, in its thread


@dataclass(frozen=True)
class ApprovalPost:
    """One post of an approval, recorded before it is made (the approval outbox's row)."""

    token: str
    approval_id: int
    purpose: Purpose
    channel: str
    thread_ts: str | None
    created_at: datetime
    repeats: int = 0  # posts made without proof that the earlier one is not there


def half_time(a: Approval) -> datetime:
    """Return the moment half of an approval's time to expiry has gone."""
    return a.created_at + (a.expires_at - a.created_at) / 2


def reping_due(a: Approval, now: datetime) -> bool:
    """Whether an undecided request should ping on-call again now: half its time has gone and
    it has not expired (its request message is known, so the ping goes in its thread)."""
    return (
        a.state is ApprovalState.PENDING
        and a.message_ts is not None
        and half_time(a) <= now < a.expires_at
    )
