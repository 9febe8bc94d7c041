"""Leases: what a holder of exclusive work (a node's reset, the sweep) knows about its hold.

The fencing token grows each time the resource changes hands, so a write that names
(resource, token) can tell whether its writer still holds it. A holder calls ``Lease.check``
before each thing it does to a node, so losing the lease stops it before its next signal. An
in-process lease (no database) cannot be lost and has no fence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubot.errors import LeaseLost


@dataclass(frozen=True)
class Fence:
    """What a fenced write names: the lease it needs and how far a success extends it."""

    resource: str
    token: int
    holder: str
    ttl_s: float


def lost_message(resource: str) -> str:
    """Return what a person is told when ``resource``'s lease is gone."""
    kind, _, name = resource.partition(":")
    if kind == "reset" and name:
        return f"lost the node lease: another gpubot may be acting on {name}"
    return f"lost the {resource} lease: another gpubot may be doing this work"


@dataclass
class Lease:
    """The holder's view of one lease (mutable: the renewal updates it)."""

    resource: str
    holder: str
    token: int
    expires_at: float  # unix time, as far as this holder knows (a lower bound)
    ttl_s: float = 0.0
    shared: bool = True  # False: an in-process lease, no row to fence on
    lost: str | None = None  # why it is gone; None while held
    took_over: dict[str, Any] | None = None  # the expired lease of a dead holder it replaced
    renewals: int = 0

    @property
    def fence(self) -> Fence | None:
        """Return the fence of writes under this lease (None: nothing to check)."""
        if not self.shared:
            return None
        return Fence(self.resource, self.token, self.holder, self.ttl_s)

    def mark_lost(self, why: str) -> None:
        """Record that the lease is gone (the first reason stays)."""
        if self.lost is None:
            self.lost = why

    def check(self, now: float | None = None) -> None:
        """Raise ``LeaseLost`` if the lease is known gone, or (given ``now``) past its expiry."""
        if self.lost is None and self.shared and now is not None and now >= self.expires_at:
            self.mark_lost("it expired before it could be renewed (the database did not answer)")
        if self.lost is not None:
            raise LeaseLost(self.resource, f"{lost_message(self.resource)} ({self.lost})")
