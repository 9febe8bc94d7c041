"""GPU-hours: each sweep adds its samples' hours (``core.usage.hours``); reports sum them.

A report reads its window's buckets, sweeps and gaps, never the raw history. A store that fails
loses that sweep's hours (reported as a gap next time), never the sweep.

With Slurm nodes, a report by user or team also asks Slurm's accounting (``sacct`` over one
Slurm node's transport: accounting is cluster-wide) for the GPU-hours allocated to each user's
jobs on those nodes, and "allocated, unused": allocated minus the GPU-hours that user's processes
were seen holding on those nodes (a process counts for its owner, so a job's processes for its
user). Accounting that cannot be read is one note line; the report goes on without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from gpubot.config import Settings
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import Clock, Transport
from gpubot.core.slurm import SLURM
from gpubot.core.slurm.sacct import allocated_ms, parse_sacct, sacct_argv
from gpubot.core.text import one_line
from gpubot.core.usage.hours import (
    GAP_INTERVALS,
    NODE_ROW,
    Claimed,
    Gap,
    UsageRecords,
    UsageSweep,
    states_of,
)
from gpubot.core.usage.report import (
    Coverage,
    Line,
    UsageReport,
    Window,
    summed,
    with_allocation,
)
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
        transport: Transport | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.transport = transport  # None: Slurm's accounting is not asked
        self.claims = claims  # None: no GPU is claimed
        self.directory: Directory = directory or NoDirectory()
        self.clock = clock
        self.interval_s = settings.sweep.interval_s  # what a sample after missing data counts for

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
        now = self.clock.now()
        try:
            window = Window.of(since, until, now)
            summed((), by)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return await self.report_of(window, by, now)

    async def last(self, seconds: float, *, by: str = "user") -> UsageReport:
        now = self.clock.now()
        return await self.report_of(Window.last(seconds, now), by, now)

    async def report_of(
        self, window: Window, by: str, now: float, *, allocation: bool = True
    ) -> UsageReport:
        """Return the report of ``window`` by ``by``; ``allocation``: with Slurm nodes, ask
        their accounting too (the Home tab does not: it shows observed hours only)."""
        slurm = [n for n in self.settings.nodes if n.scheduler == SLURM] if allocation else []
        asks = bool(slurm) and self.transport is not None and by != "node"
        kind = "node" if by == "node" else "node-holder" if asks else "holder"
        rec = await self.store.records(window.since, window.until, by=kind)
        teams = await self.teams() if by == "team" else None
        lines = summed(rec.rows, by, teams)
        coverage = self._coverage(rec, window, now)
        if not slurm:
            return UsageReport(window, by, lines, coverage)
        if not asks:
            why = "by user or team only" if by == "node" else "Slurm not asked"
            return UsageReport(window, by, lines, coverage, slurm_notes=(f"allocated h: {why}",))
        allocated, notes = await self._allocated(slurm, window, now)
        if allocated is None:
            return UsageReport(window, by, lines, coverage, slurm_notes=notes)
        on_slurm = {n.name for n in slurm}
        observed: dict[str, int] = {}
        for r in rec.rows:
            if r.node in on_slurm and r.user != NODE_ROW:
                observed[r.user] = observed.get(r.user, 0) + r.busy + r.idle + r.unknown
        lines = with_allocation(lines, by, allocated, observed, teams)
        return UsageReport(window, by, lines, coverage, allocation=True, slurm_notes=notes)

    async def _allocated(
        self, slurm: list[NodeConfig], window: Window, now: float
    ) -> tuple[dict[str, int] | None, tuple[str, ...]]:
        """Return each user's GPU-ms allocated on the ``slurm`` nodes in ``window`` (None: not
        read) and the note lines that say what it rests on or why it could not be read. The
        first node that answers runs ``sacct``; one that fails to is the note."""
        assert self.transport is not None
        names = [n.slurm_name for n in slurm]
        until = min(window.until, now)
        timeout = self.settings.slurm.timeout_s
        argv = sacct_argv(window.since, until, names, timeout)
        why = "no Slurm node answered"
        for node in slurm:
            try:
                res = await self.transport.run(node, argv, timeout=timeout + 3)
            except GpubotError as exc:
                why = f"{node.name}: {str(exc).removeprefix(node.name + ': ')}"
                continue
            if res.exit_status != 0:
                said = one_line((res.stderr or res.stdout).strip())[:200]
                why = f"sacct on {node.name} exited {res.exit_status}: {said or 'no output'}"
                break
            read = parse_sacct(res.stdout, set(names))
            notes = [
                f"allocated h: Slurm's accounting (sacct on {node.name}), {len(read.jobs)} GPU "
                f"job(s) on {len(names)} Slurm node(s); alloc. unused h: allocated minus the "
                "GPU-hours their user's processes were seen holding there"
            ]
            if read.skipped:
                notes.append(f"allocated h: {read.skipped} sacct row(s) did not read, left out")
            return allocated_ms(read.jobs, window.since, until, now), tuple(notes)
        return None, (f"no allocated h (Slurm's accounting not read): {one_line(why)}",)

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
            report = await self.report_of(window, "user", now, allocation=False)
        except StoreError as exc:
            log.warning("GPU-hours unavailable for the Home tab: %s", exc)
            return None
        return next((ln for ln in report.lines if ln.name == user), None)


def _claimed_at(claims: ClaimedIntervals | None, now: float) -> list[Claimed]:
    """Return the claims in force at ``now``: the window asked is the second from ``now``,
    never ``[now, now]``, whose cut claims would cover nothing."""
    return [] if claims is None else [Claimed(*c) for c in claims.intervals(now, now + 1.0)]
