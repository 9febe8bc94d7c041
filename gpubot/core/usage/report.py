"""The GPU-hours report: a window, the buckets summed by user, team or node, and its coverage.

A window is whole UTC hours (the buckets'), widened from ``--since``/``--until``; the report says
which hours. Every error is one line for a person (``ValueError``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gpubot.core import durations
from gpubot.core.slurm import SLURM
from gpubot.core.text_table import table_lines
from gpubot.core.usage.hours import HOUR_S, KINDS, NODE_ROW, Gap, Usage, hour_of

BY = ("user", "team", "node")
NO_TEAM = "(no team)"
DEFAULT_SINCE = "7d"
MS_PER_H = 3_600_000
SHOWN_GAPS = 10  # gaps a text report lists; the rest are counted
ALLOC = ("allocated", "alloc_unused")  # the columns Slurm's accounting adds
ALLOC_NAMES = {"allocated": "allocated", "alloc_unused": "allocated_unused"}  # JSON and CSV


@dataclass(frozen=True)
class Window:
    """Whole UTC hours: from ``since`` up to (not including) ``until``."""

    since: int
    until: int

    @classmethod
    def of(cls, since: str | None, until: str | None, now: float) -> Window:
        """Return the window of ``--since``/``--until`` texts (None: 7 days ago; now)."""
        start = durations.when(since or DEFAULT_SINCE, now, "--since")
        end = now if until is None else durations.when(until, now, "--until")
        if start >= end:
            raise ValueError(
                f"--since ({utc_minute(start)}) must be before --until ({utc_minute(end)})"
            )
        return cls._hours(start, end)

    @classmethod
    def last(cls, seconds: float, now: float) -> Window:
        """Return the window of the last ``seconds`` (more than zero) up to ``now``."""
        return cls._hours(max(now - seconds, 0.0), now)

    @classmethod
    def _hours(cls, start: float, end: float) -> Window:
        return cls(hour_of(start), hour_of(end) + (0 if end % HOUR_S == 0 else HOUR_S))

    def text(self) -> str:
        return f"{utc_minute(self.since)} to {utc_minute(self.until)} UTC"


def utc_minute(t: float) -> str:
    """Return a unix time as ``2026-11-30 08:00`` (UTC)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class Line:
    """One row of the report: milliseconds per kind, and the samples behind them."""

    name: str
    busy: int
    idle: int
    unknown: int
    unused: int
    free: int
    samples: int
    # Slurm's accounting (``--by user|team`` with Slurm nodes): GPU-ms allocated to the jobs,
    # and of those not seen used; None: not read
    allocated: int | None = None
    alloc_unused: int | None = None

    def hours(self, kind: str) -> float:
        ms: int | None = getattr(self, kind)
        return (ms or 0) / MS_PER_H


@dataclass(frozen=True)
class Coverage:
    """What the report rests on: sweeps taken in the window, and the stretches missing."""

    sweeps: int
    interval_s: float
    gaps: tuple[Gap, ...] = ()


@dataclass(frozen=True)
class UsageReport:
    """GPU-hours by ``by`` over ``window``."""

    window: Window
    by: str
    lines: tuple[Line, ...]
    coverage: Coverage
    allocation: bool = False  # the lines carry Slurm's allocated hours
    slurm_notes: tuple[str, ...] = ()  # what they rest on, or why there are none

    def to_dict(self) -> dict[str, object]:
        """Return the report as JSON-ready data (milliseconds exact, hours rounded)."""
        rows = []
        for line in self.lines:
            row: dict[str, object] = {self.by: line.name, "samples": line.samples}
            for k in self._kinds():
                row[f"{k}_ms"] = getattr(line, k)
                row[f"{k}_h"] = round(line.hours(k), 3)
            for k in self._alloc():
                row[f"{ALLOC_NAMES[k]}_ms"] = getattr(line, k) or 0
                row[f"{ALLOC_NAMES[k]}_h"] = round(line.hours(k), 3)
            rows.append(row)
        return {
            "since": self.window.since,
            "until": self.window.until,
            "window": self.window.text(),
            "by": self.by,
            "sweeps": self.coverage.sweeps,
            "interval_s": self.coverage.interval_s,
            "gaps": [{"node": g.node, "start": g.start, "end": g.end} for g in self.coverage.gaps],
            "rows": rows,
            SLURM: {"allocation": self.allocation, "notes": list(self.slurm_notes)},
        }

    def _kinds(self) -> tuple[str, ...]:
        return KINDS if self.by == "node" else tuple(k for k in KINDS if k != "free")

    def _alloc(self) -> tuple[str, ...]:
        return ALLOC if self.allocation else ()

    def csv(self) -> str:
        """Return the rows as CSV: hours to three decimals, and the samples."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        kinds = (*self._kinds(), *self._alloc())
        w.writerow([self.by, *(f"{ALLOC_NAMES.get(k, k)}_h" for k in kinds), "samples"])
        for line in self.lines:
            w.writerow([line.name, *(f"{line.hours(k):.3f}" for k in kinds), line.samples])
        return out.getvalue()

    def table(self) -> list[list[str]]:
        """Return the rows as text cells, a header first (hours to one decimal)."""
        kinds = (*self._kinds(), *self._alloc())
        rows = [[self.by, *(HEADS.get(k, f"{k} h") for k in kinds)]]
        rows += [[ln.name, *(f"{ln.hours(k):.1f}" for k in kinds)] for ln in self.lines]
        return rows

    def most_unused(self) -> Line | None:
        """Return the line with the most "allocated, unused" hours (None: none has any)."""
        best = max(self.lines, key=lambda ln: (ln.alloc_unused or 0, ln.name), default=None)
        return best if best is not None and (best.alloc_unused or 0) > 0 else None

    def notes(self) -> list[str]:
        """Return what the figures rest on and where data is missing, one line each."""
        c = self.coverage
        lines = [f"{c.sweeps} sweep(s) in {self.window.text()} (every {c.interval_s:g} s)"]
        top = self.most_unused()
        if top is not None:
            lines.append(
                f"most allocated, unused: {top.name} {top.hours('alloc_unused'):.1f} h "
                f"of {top.hours('allocated'):.1f} h allocated by Slurm"
            )
        lines += self.slurm_notes
        if c.sweeps == 0:
            lines.append("no data: no sweep counted GPU-hours in this window")
            return lines
        if not c.gaps:
            lines.append("no data missing")
            return lines
        lines.append(f"data missing in {len(c.gaps)} stretch(es):")
        for g in c.gaps[:SHOWN_GAPS]:
            end = "now (no sample since)" if g.end is None else utc_minute(g.end)
            lines.append(f"  {g.node}: {utc_minute(g.start)} to {end}")
        if len(c.gaps) > SHOWN_GAPS:
            lines.append(f"  … and {len(c.gaps) - SHOWN_GAPS} more (--json lists them all)")
        return lines

    def text(self) -> str:
        rows = self.table()
        out = [f"GPU-hours by {self.by}, {self.window.text()}"]
        out += table_lines(rows, right=range(1, len(rows[0])))
        if len(rows) == 1:
            out.append("(no GPU was sampled in this window)")
        return "\n".join(out + self.notes())


def summed(
    rows: Iterable[Usage], by: str, teams: Mapping[str, Collection[str]] | None = None
) -> tuple[Line, ...]:
    """Sum bucket rows by user, team or node, most busy + idle first; a person counts for each
    of their teams (``NO_TEAM`` when in none)."""
    if by not in BY:
        raise ValueError(f"bad --by {by!r}: expected one of {', '.join(BY)}")
    member = _members(teams)
    acc: dict[str, Usage] = {}
    for r in rows:
        if (by == "node") != (r.user == NODE_ROW):
            continue
        names = [r.node] if by == "node" else [r.user]
        if by == "team":
            names = member.get(r.user, [NO_TEAM])
        for name in names:
            acc.setdefault(name, Usage(0, "", 0, name)).add(r)
    lines = [
        Line(n, u.busy, u.idle, u.unknown, u.unused, u.free, u.samples) for n, u in acc.items()
    ]
    lines.sort(key=lambda ln: (-(ln.busy + ln.idle + ln.unknown), ln.name))
    return tuple(lines)


HEADS = {
    "unused": "claimed unused h",
    "allocated": "allocated h",
    "alloc_unused": "alloc. unused h",
}


def _members(teams: Mapping[str, Collection[str]] | None) -> dict[str, list[str]]:
    """Return each person's teams."""
    member: dict[str, list[str]] = {}
    for team, users in (teams or {}).items():
        for u in users:
            member.setdefault(u, []).append(team)
    return member


def with_allocation(
    lines: Iterable[Line],
    by: str,
    allocated: Mapping[str, int],
    observed: Mapping[str, int],
    teams: Mapping[str, Collection[str]] | None = None,
) -> tuple[Line, ...]:
    """Add Slurm's allocation to user or team lines: per user the GPU-ms allocated, and
    "allocated, unused" = allocated minus ``observed`` (their GPU-ms seen on the Slurm nodes),
    never below 0; a team's are its users' sums. A user allocated GPUs but never seen gets a
    line of their own."""
    unused = {u: max(0, a - observed.get(u, 0)) for u, a in allocated.items()}
    alloc = dict(allocated)
    if by == "team":
        member = _members(teams)
        by_team: dict[str, int] = {}
        unused_team: dict[str, int] = {}
        for u, a in allocated.items():
            for t in member.get(u, [NO_TEAM]):
                by_team[t] = by_team.get(t, 0) + a
                unused_team[t] = unused_team.get(t, 0) + unused[u]
        alloc, unused = by_team, unused_team
    out = [
        replace(ln, allocated=alloc.get(ln.name, 0), alloc_unused=unused.get(ln.name, 0))
        for ln in lines
    ]
    seen = {ln.name for ln in out}
    out += [
        Line(n, 0, 0, 0, 0, 0, 0, allocated=a, alloc_unused=unused.get(n, 0))
        for n, a in sorted(alloc.items())
        if n not in seen
    ]
    return tuple(out)


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class Digest:
    """When the weekly digest is posted: a weekday and a UTC time ("mon 09:00")."""

    weekday: int  # 0: Monday
    hour: int
    minute: int

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse ``"mon 09:00"``; raise ``ValueError`` saying what was expected."""
        want = f'expected a weekday and a UTC time, e.g. "mon 09:00", got {text!r}'
        parts = text.strip().lower().split()
        if len(parts) != 2 or parts[0][:3] not in DAYS or ":" not in parts[1]:
            raise ValueError(want)
        hh, _, mm = parts[1].partition(":")
        if not (hh.isdigit() and mm.isdigit() and int(hh) < 24 and int(mm) < 60):
            raise ValueError(want)
        return cls(DAYS.index(parts[0][:3]), int(hh), int(mm))

    def last_due(self, now: float) -> float:
        """Return the latest time at or before ``now`` the digest was due."""
        day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        start = day.timestamp() - day.weekday() * 86400 + self.weekday * 86400
        due = start + self.hour * 3600 + self.minute * 60
        return due if due <= now else due - 7 * 86400

    def period(self, now: float) -> str:
        """Return the name of the digest due at or before ``now`` ("digest:2026-11-30")."""
        return "digest:" + datetime.fromtimestamp(self.last_due(now), UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class ReportSettings:
    """``[teams]`` and ``[reports]``: teams and the weekly digest (None: off)."""

    teams: tuple[tuple[str, tuple[str, ...]], ...] = ()
    team_groups: tuple[tuple[str, str], ...] = ()  # team -> Slack user group id
    digest: Digest | None = None
    digest_by: str = "team"
    digest_channel: str | None = None  # None: the alerts channel
