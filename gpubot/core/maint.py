"""Maintenance windows (issue 37) as pure decisions: the ``maint`` commands, when a window
starts, which claims run into one, who is told ahead, and which nodes do not page.

A window is a node's planned work, from ``start`` to ``end`` (unix seconds, UTC). It refuses
claims that would run into it, DMs the holders of claims that do once ``notify_before`` ahead,
and keeps a sweep's findings on its node from being posted while it is open (they are still
recorded, so they post once it ends if they are still there). ``maint end`` closes it early.

``from`` takes the forms ``report --since`` and ``audit list --since`` take for a moment (an ISO
date or time, UTC unless it says: ``durations.when``) and the people's forms: ``now``,
``HH:MM`` (the next such time), ``today 14:00``, ``tomorrow 02:00`` and a weekday with a time
(``Sat 02:00``: the next Saturday at 02:00, today if still ahead). All times are UTC.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gpubot.core import durations
from gpubot.core.names import NODE_NAME
from gpubot.errors import UsageError

DEFAULT_NOTIFY_BEFORE_S = 3600.0  # ``[maint] notify_before``
MAX_WINDOW_S = 14 * 86400.0  # a longer window is a typo (or a decommission: drain it)
MAX_AHEAD_S = 365 * 86400.0  # how far ahead a window may start
USAGE = (
    "/gpu maint NODE from WHEN for DURATION because REASON  — plan maintenance (WHEN: now, "
    "Sat 02:00, tomorrow 02:00, 14:00 or 2026-12-12T02:00, UTC); claims into it are refused, "
    "holders told ahead, alerts on the node held;  /gpu maint end NODE  — end it now;  "
    "/gpu maint [NODE]  — list; on-call only, audited"
)
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_CLOCK = re.compile(r"([01]?[0-9]|2[0-3]):([0-5][0-9])")


@dataclass(frozen=True)
class MaintSettings:
    """``[maint]``: how long before a window the holders of claims that run into it are told."""

    notify_before_s: float = DEFAULT_NOTIFY_BEFORE_S


class WindowStore(Protocol):
    """The windows not over at ``now`` (``store.maint.DbMaint``)."""

    async def live(self, now: float, node: str | None = None) -> list[Window]: ...


class MaintStore(WindowStore, Protocol):
    """The windows, planned, ended and refused, each audited (``store.maint.DbMaint``)."""

    async def open(
        self,
        node: str,
        start: float,
        length_s: float,
        reason: str,
        *,
        by: str,
        source: str,
        now: float,
    ) -> Window: ...

    async def end(self, node: str, *, by: str, source: str, now: float) -> Window: ...

    async def refused(
        self, node: str | None, *, by: str, source: str, asked: str, why: str
    ) -> None: ...


@dataclass(frozen=True)
class MaintOpen:
    """``maint NODE from WHEN for DURATION because REASON``."""

    node: str
    start: str  # the words after ``from`` (``starts_at`` reads them against a time)
    length_s: float
    reason: str


@dataclass(frozen=True)
class MaintEnd:
    """``maint end NODE``: close the node's open (or next) window now."""

    node: str


@dataclass(frozen=True)
class MaintList:
    """``maint [NODE]``: the windows not ended yet (of one node)."""

    node: str | None = None


MaintCommand = MaintOpen | MaintEnd | MaintList


@dataclass(frozen=True)
class Window:
    """One maintenance window as stored."""

    id: int
    node: str
    start: float
    end: float
    reason: str
    by: str  # who opened it, as the front end names them
    created: float
    ended_at: float | None = None  # closed early (``maint end``)
    ended_by: str | None = None

    @property
    def until(self) -> float:
        """When it stops counting: its end, or when it was closed early."""
        return self.end if self.ended_at is None else min(self.end, self.ended_at)

    def open_at(self, now: float) -> bool:
        return self.start <= now < self.until

    def live_at(self, now: float) -> bool:
        """Not over yet: open, or still ahead."""
        return now < self.until

    def shown(self, now: float) -> str:
        """``maintenance Sat 02:00–06:00 UTC: kernel update, by olga``."""
        return (
            f"maintenance {window_text(self.start, self.until, now)}: {self.reason}, by {self.by}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "start": self.start,
            "end": self.end,
            "reason": self.reason,
            "by": self.by,
            "ended_at": self.ended_at,
            "ended_by": self.ended_by,
        }


def parse(args: list[str], reason: str | None) -> MaintCommand:
    """Parse the words after ``maint`` (``reason``: what followed ``because``, if anything)."""
    if not args:
        if reason is not None:
            raise UsageError(f"a reason needs a window; usage: {USAGE}")
        return MaintList()
    if args[0].lower() == "end":
        if len(args) != 2 or reason is not None:
            raise UsageError("usage: /gpu maint end NODE")
        return MaintEnd(_node(args[1]))
    node = _node(args[0])
    rest = args[1:]
    if not rest:
        if reason is not None:
            raise UsageError(f"a reason needs a window; usage: {USAGE}")
        return MaintList(node)
    words = [w.lower() for w in rest]
    if words[0] != "from" or "for" not in words:
        raise UsageError(f"maint {node}: say from when and for how long; usage: {USAGE}")
    at = words.index("for")
    start = " ".join(rest[1:at])
    if not start:
        raise UsageError(f"maint {node}: say from when (e.g. `from Sat 02:00`)")
    if len(rest) != at + 2:
        extra = rest[at + 2] if len(rest) > at + 2 else "for"
        raise UsageError(f"unexpected {extra!r} in maint {node}; usage: {USAGE}")
    try:
        length = durations.parse(rest[at + 1])
    except durations.DurationError as exc:
        raise UsageError(f"bad duration {rest[at + 1]!r}: {exc.expected}") from None
    if length > MAX_WINDOW_S:
        raise UsageError(
            f"a maintenance window lasts at most {durations.format(MAX_WINDOW_S)}; "
            "for longer, drain the node"
        )
    if reason is None:
        raise UsageError(f"maint {node}: say why (`… because kernel update`)")
    starts_at(start, 0.0)  # the form only: the moment is read when it is opened
    return MaintOpen(node, start, length, reason)


def starts_at(text: str, now: float) -> float:
    """Return the unix time ``text`` names, read at ``now`` (UTC); ``UsageError`` if none."""
    words = text.lower().split()
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if words == ["now"]:
        return now
    if len(words) == 1 and (m := _CLOCK.fullmatch(words[0])):
        at = today + timedelta(hours=int(m[1]), minutes=int(m[2]))
        return _ahead(at, now, timedelta(days=1))
    if len(words) == 2 and (m := _CLOCK.fullmatch(words[1])):
        clock = timedelta(hours=int(m[1]), minutes=int(m[2]))
        day = words[0][:3]
        if words[0] in ("today", "tomorrow"):
            return (today + timedelta(days=words[0] == "tomorrow") + clock).timestamp()
        if day in _DAYS and _is_day(words[0]):
            ahead = (_DAYS.index(day) - today.weekday()) % 7
            return _ahead(today + timedelta(days=ahead) + clock, now, timedelta(days=7))
    iso = "T".join(text.split()) if len(words) == 2 else text.strip()
    if "-" in iso:
        try:
            return durations.when(iso, now, "start")
        except ValueError:
            pass
    raise UsageError(
        f"bad start {text!r}: expected now, HH:MM, today/tomorrow HH:MM, a weekday and a time "
        "(Sat 02:00) or a UTC date and time (2026-12-12T02:00)"
    )


def _is_day(word: str) -> bool:
    full = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    return any(d.startswith(word) for d in full) and len(word) >= 3


def _ahead(at: datetime, now: float, step: timedelta) -> float:
    """Return ``at``, or ``at + step`` when ``at`` is past (the next such time)."""
    return (at if at.timestamp() >= now else at + step).timestamp()


def check_new(start: float, length_s: float, now: float, others: Iterable[Window]) -> float:
    """Return the end of a new window from ``start``; refuse one over already, too far ahead,
    or overlapping one of the node's windows not over yet."""
    end = start + length_s
    if end <= now:
        raise UsageError(
            f"that window ended already ({window_text(start, end, now)}): nothing to plan"
        )
    if start - now > MAX_AHEAD_S:
        raise UsageError("a maintenance window starts at most a year ahead")
    for w in others:
        if w.live_at(now) and start < w.until and w.start < end:
            raise UsageError(
                f"{w.node} has a window already: {w.shown(now)} (#{w.id}); end it first "
                f"(`/gpu maint end {w.node}`)"
            )
    return end


def clash(node: str, start: float, end: float, windows: Iterable[Window]) -> Window | None:
    """Return the first window of ``node`` that a claim from ``start`` to ``end`` runs into."""
    found = [w for w in windows if w.node == node and start < w.until and w.start < end]
    return min(found, key=lambda w: w.start) if found else None


def refusal(w: Window, start: float, end: float, now: float) -> str:
    """Say why a claim from ``start`` to ``end`` is refused, and what would be granted."""
    head = f"not claimed: {w.node} is down for {w.shown(now)}"
    if w.start > start:
        room = durations.format(w.start - start, "minutes")
        return f"{head}; a claim until {clock(end, now)} runs into it: claim for at most {room}"
    return f"{head}; claim again after {clock(w.until, now)}"


def quiet_nodes(windows: Iterable[Window], now: float) -> frozenset[str]:
    """Return the nodes whose findings are recorded but not posted now: an open window's."""
    return frozenset(w.node for w in windows if w.open_at(now))


@dataclass(frozen=True)
class Ahead:
    """A claim that runs into a window, its holder to be told (once)."""

    window: Window
    claim_id: int
    chat_id: str
    gpu: int
    claim_end: float

    @property
    def subject(self) -> str:
        """The DM's outbox subject: one DM per window and claim, across restarts and replicas."""
        return f"dm:maint:ahead:{self.window.id}:{self.claim_id}"


@dataclass(frozen=True)
class ProcsAhead:
    """A person whose processes run on a node with a window ahead (or open), to be told once."""

    window: Window
    chat_id: str
    held: tuple[tuple[int, int], ...]  # (gpu, pid) of each of their processes there

    @property
    def subject(self) -> str:
        """The DM's outbox subject: one DM per window and person."""
        return f"dm:maint:ahead:{self.window.id}:user:{self.chat_id}"


def _due(windows: Iterable[Window], now: float, before_s: float) -> list[Window]:
    """The windows open, or starting within ``before_s``."""
    return [w for w in windows if w.live_at(now) and now >= w.start - before_s]


def _ahead_of(windows: Iterable[Window], now: float, before_s: float) -> list[Window]:
    """The windows not open yet that start within ``before_s``."""
    return [w for w in _due(windows, now, before_s) if now < w.start]


def due_notices(
    windows: Iterable[Window],
    claims: Iterable[tuple[int, str, str, int, float, float]],
    now: float,
    before_s: float,
) -> list[Ahead]:
    """Return who to tell now: each claim (id, node, chat id, gpu, start, end) that runs into a
    window starting within ``before_s`` (or open already)."""
    out: list[Ahead] = []
    live = _due(windows, now, before_s)
    for cid, node, chat, gpu, start, end in claims:
        for w in live:
            if w.node == node and start < w.until and w.start < end:
                out.append(Ahead(w, cid, chat, gpu, end))
    return out


def due_holders(
    windows: Iterable[Window],
    holders: Iterable[tuple[str, str, int, int]],
    now: float,
    before_s: float,
) -> list[ProcsAhead]:
    """Return who to tell now of their processes (node, chat id, gpu, pid) on a node whose
    window starts within ``before_s``: one notice per window and person. Not once it is open:
    the node is being worked on then (it may not answer), and the notice would come late."""
    live = _ahead_of(windows, now, before_s)
    held: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for node, chat, gpu, pid in holders:
        for w in live:
            if w.node == node:
                held.setdefault((w.id, chat), []).append((gpu, pid))
    by_id = {w.id: w for w in live}
    return [ProcsAhead(by_id[i], chat, tuple(sorted(h))) for (i, chat), h in sorted(held.items())]


def nodes_due(windows: Iterable[Window], now: float, before_s: float) -> list[str]:
    """Return the nodes with a window starting within ``before_s`` (their holders are read to
    be told)."""
    return sorted({w.node for w in _ahead_of(windows, now, before_s)})


def clock(t: float, now: float) -> str:
    """``Sat 02:00`` within six days of ``now``, else ``Sat 12 Dec 02:00``."""
    at = datetime.fromtimestamp(t, UTC)
    near = abs(t - now) < 6 * 86400
    return at.strftime("%a %H:%M" if near else "%a %d %b %H:%M")


def window_text(start: float, end: float, now: float) -> str:
    """``Sat 02:00–06:00 UTC`` (the end's day too when it is another day)."""
    a, b = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    tail = b.strftime("%H:%M") if a.date() == b.date() else clock(end, now)
    return f"{clock(start, now)}–{tail} UTC"


def _node(text: str) -> str:
    if not NODE_NAME.fullmatch(text):
        raise UsageError(f"bad node name {text[:40]!r}: letters, digits, '.', '_' and '-' only")
    return text
