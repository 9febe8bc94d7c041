"""The messages an approval sends that must appear once: its request to on-call, the re-ping at
half its expiry, the word to the requester when it expired unanswered, and the word in its
thread (and to the requester) when an approved action was interrupted, could not run yet, never
could, or ran on a retry.

Each goes through the outbox under its subject (``subject``): one row per approval and purpose,
recorded only while the approval is in a state for it (``NEEDS``), so that neither a restart nor
a second replica posts it again.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from gpubot.core.approval.model import Approval
from gpubot.core.models import ApprovalState

PREFIX = "approval:"  # the outbox subjects of approvals' posts


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


S = ApprovalState
# The states an approval must be in for a post of each purpose to be recorded.
NEEDS: dict[Purpose, frozenset[ApprovalState]] = {
    Purpose.REQUEST: frozenset({S.PENDING}),
    Purpose.REPING: frozenset({S.PENDING}),
    Purpose.EXPIRED: frozenset({S.EXPIRED}),
    Purpose.INTERRUPTED: frozenset({S.INCOMPLETE}),
    Purpose.INTERRUPTED_DM: frozenset({S.INCOMPLETE}),
    Purpose.WAITING: frozenset({S.WAITING, S.APPROVED}),  # approved again: a retry under way
    Purpose.GAVE_UP: frozenset({S.FAILED}),
    Purpose.RETRIED: frozenset({S.EXECUTED, S.FAILED}),
}


def subject(approval_id: int, purpose: Purpose) -> str:
    """Return the outbox subject of an approval's post of ``purpose``."""
    return f"{PREFIX}{approval_id}:{purpose}"


def parse_subject(text: str) -> tuple[int, Purpose] | None:
    """Return the approval and purpose an outbox subject names (None: not an approval's)."""
    if not text.startswith(PREFIX):
        return None
    aid, _, purpose = text.removeprefix(PREFIX).partition(":")
    try:
        return int(aid), Purpose(purpose)
    except ValueError:
        return None


def may_record(
    purpose: Purpose,
    state: ApprovalState,
    created_at: datetime,
    expires_at: datetime,
    now: datetime,
) -> bool:
    """Whether a post of ``purpose`` may be recorded now for an approval in ``state``: a
    re-ping only between half its time and its expiry."""
    if state not in NEEDS[purpose]:
        return False
    half_time = created_at + (expires_at - created_at) / 2
    return purpose is not Purpose.REPING or half_time <= now < expires_at


def reping_due(a: Approval, now: datetime) -> bool:
    """Whether an undecided request should ping on-call again now: half its time has gone and
    it has not expired (its request message is known, so the ping goes in its thread)."""
    return a.ref is not None and may_record(
        Purpose.REPING, a.state, a.created_at, a.expires_at, now
    )
