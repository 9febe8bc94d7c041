"""GPU-hours: each sweep adds its samples' hours (``core.usage.hours``); reports sum them.

A report reads its window's buckets, sweeps and gaps, never the raw history. A store that fails
loses that sweep's hours (reported as a gap next time), never the sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from gpubot.config import Settings
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.models import NodeSnapshot
from gpubot.core.ports import Clock
from gpubot.core.usage.hours import (
    GAP_INTERVALS,
    Claimed,
    Gap,
    UsageRecords,
    UsageSweep,
    states_of,
)
from gpubot.core.usage.report import Coverage, Line, UsageReport, Window, summed
from gpubot.errors import DUTY_TURN, GpubotError, StoreError, UsageError
from gpubot.services.directory import Directory, NoDirectory
from gpubot.services.offload import off_loop

log = logging.getLogger(__name__)

Interval = tuple[str, int, str, float, float]  # (node, gpu, user, start, end)


class ClaimedIntervals(Protocol):
    """Who claimed which GPU when (the claims' store implements it)."""

    def intervals(self, since: float, until: float) -> Iterable[Interval]:
        """Return the claims overlapping [since, until]: (node, gpu, user, start, end)."""
        ...


class UsageStore(Protocol):
    """Where the buckets are kept (``store.usage.DbUsage``)."""

    async def add_sweep(self, sweep: UsageSweep) -> int:
        """Add one sweep's GPU-hours; return the buckets written."""
        ...

    async def records(self, since: float, until: float, *, by: str = "") -> UsageRecords:
        """Return the buckets of [since, until) and what they rest on."""
        ...


class UsageService:
    """Counts GPU-hours at every sweep and answers reports."""

    def __init__(
        self,
        settings: Settings,
        store: UsageStore,
        *,
        claims: ClaimedIntervals | None = None,
        directory: Directory | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.store = store
        self.claims = claims  # None: no GPU is claimed
        self.directory: Directory = directory or NoDirectory()
        self.clock = clock

    @property
    def interval_s(self) -> float:
        """Return the sweep interval (what a sample after missing data counts for)."""
        return self.settings.sweep.interval_s

    async def record(self, snaps: Sequence[NodeSnapshot], now: float) -> None:
        """Add one sweep's GPU-hours (warned, never raised, when the store fails)."""
        if not snaps:
            return
        states = await off_loop(states_of, snaps)
        try:
            claims = await off_loop(_claimed_at, self.claims, now)
        except Exception:  # another service's port: its failure loses only "claimed"
            log.exception(
                "claims unavailable: this sweep counts no GPU as claimed", extra=DUTY_TURN
            )
            claims = []
        try:
            await self.store.add_sweep(UsageSweep(now, states, claims, self.interval_s))
        except StoreError as exc:
            log.warning("GPU-hours of this sweep not recorded: %s", exc, extra=DUTY_TURN)

    async def report(
        self, since: str | None = None, until: str | None = None, *, by: str = "user"
    ) -> UsageReport:
        """Return GPU-hours by ``by`` over the window of ``--since``/``--until`` texts."""
        now = self.clock.now()
        try:
            window = Window.of(since, until, now)
            summed((), by)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return await self.report_of(window, by, now)

    async def last(self, seconds: float, *, by: str = "user") -> UsageReport:
        """Return GPU-hours by ``by`` over the last ``seconds`` (a chat command's period)."""
        now = self.clock.now()
        return await self.report_of(Window.last(seconds, now), by, now)

    async def report_of(self, window: Window, by: str, now: float) -> UsageReport:
        """Return the report of ``window`` (whole hours) by ``by``."""
        rec = await self.store.records(
            window.since, window.until, by="node" if by == "node" else "holder"
        )
        teams = await self.teams() if by == "team" else None
        lines = summed(rec.rows, by, teams)
        return UsageReport(window, by, lines, self._coverage(rec, window, now))

    def _coverage(self, rec: UsageRecords, window: Window, now: float) -> Coverage:
        """Return the sweeps and gaps, with each node silent since its last sample (longer
        than ``GAP_INTERVALS`` intervals before the window's end) as an open gap."""
        end = min(now, window.until)
        gaps = list(rec.gaps)
        for node, last in sorted(rec.last_seen.items()):
            if last < end - GAP_INTERVALS * self.interval_s:
                gaps.append(Gap(node, max(last, window.since), None))
        gaps.sort(key=lambda g: (g.start, g.node))
        return Coverage(rec.sweeps, self.interval_s, tuple(gaps))

    async def teams(self) -> dict[str, tuple[str, ...]]:
        """Return each team's Linux users; a user group that cannot be read counts nobody."""
        cfg = self.settings.reports
        out = {name: users for name, users in cfg.teams}
        linux_of = self.settings.policy.users
        for name, group in cfg.team_groups:
            try:
                members = await self.directory.group_members(group)
            except GpubotError as exc:
                log.warning("team %s: user group %s unreadable: %s", name, group, exc)
                members = frozenset()
            users = sorted({linux_of[m] for m in members if m in linux_of})
            out[name] = tuple(sorted({*out.get(name, ()), *users}))
        return out

    async def personal(self, user: str, *, days: float = 7.0) -> Line | None:
        """Return ``user``'s GPU-hours over the last ``days`` (None: none, or unreadable)."""
        now = self.clock.now()
        window = Window.last(days * 86400.0, now)
        try:
            report = await self.report_of(window, "user", now)
        except StoreError as exc:
            log.warning("GPU-hours unavailable for the Home tab: %s", exc)
            return None
        return next((ln for ln in report.lines if ln.name == user), None)


def _claimed_at(claims: ClaimedIntervals | None, now: float) -> list[Claimed]:
    """Return the claims in force at ``now``: the window asked is the second from ``now``,
    never ``[now, now]``, whose cut claims would cover nothing."""
    return [] if claims is None else [Claimed(*c) for c in claims.intervals(now, now + 1.0)]
