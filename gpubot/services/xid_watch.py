"""The sweep's kernel-log watch: one bounded read per node per sweep, the events of the window.

Each sweep reads what the driver wrote since the previous read, beside the probe and within its
budget: the journal after its cursor in bounded steps (so a backlog never times out every later
read, and a read that ends behind says so in the node's note), else dmesg, whose counts are the
whole ring buffer's, so only their increase is summarised. After a restart the first read goes
back one window: an open finding is found again (no second alert), a cleared one stays cleared.
A read that fails never fails the node's sweep.

A read keeps the newest lines of each class up to its cap and counts every driver line per (bus,
code): what a cap dropped becomes one summary event, so a user's flood of their own job's lines
never hides another GPU's fault.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace

from gpubot.config import Settings
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import Finding
from gpubot.core.health.flags import flag_snapshot
from gpubot.core.health.kernlog import (
    MAX_APP_LINES,
    MAX_ENTRIES,
    MAX_LINES,
    CountKey,
    KernelRead,
    XidEvent,
    increase,
    is_app,
    kernlog_argv,
    parse_event,
    parse_kernlog,
    summaries,
)
from gpubot.core.health.xid import DEFAULT_WINDOW_S, Seen, bus_map, classify, recent, xid_findings
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import Clock, Transport
from gpubot.errors import GpubotError

log = logging.getLogger(__name__)

CountXid = Callable[[str, str, str], None]  # node, gpu ("-": the node's), code ("sxid:N")
MAX_COUNTED = 10_000  # lines of one summary counted in the metric, one call each
MAX_STEPS = 12  # journal steps one read takes at most
MIN_STEP_S = 0.5  # the least budget a further step is started with


@dataclass
class _Node:
    cursor: str | None = None  # the journal's, after the last read
    last_at: float | None = None  # dmesg: the newest line's time seen
    counts: dict[CountKey, int] | None = None  # dmesg: the previous read's (the whole buffer's)
    seen: list[Seen] = field(default_factory=list)
    fresh: list[Seen] = field(default_factory=list)  # not counted yet
    said: str = ""  # the last "cannot read" logged
    note: tuple[float, str] | None = None  # the last read's summary of what its caps dropped


@dataclass(eq=False)
class XidWatch:
    """Reads each node's kernel log in the sweep; returns the Xid and SXid findings."""

    transport: Transport
    _: KW_ONLY
    window_s: float = DEFAULT_WINDOW_S
    timeout_s: float = 10.0
    clock: Clock = SYSTEM_CLOCK
    count: CountXid | None = None
    entries: int = MAX_ENTRIES  # journal entries one step takes (a backlog: in steps)
    steps: int = MAX_STEPS  # steps one read takes at most (within timeout_s in all)
    _nodes: dict[str, _Node] = field(default_factory=dict, init=False)
    _last: dict[str, NodeSnapshot] = field(default_factory=dict, init=False)  # the bus-id maps

    async def read(self, node: NodeConfig) -> None:
        """Read what ``node``'s driver wrote since the last read (fails soft): one exec, and
        while the journal's steps come back full, the next step within the read's budget."""
        st = self._nodes.setdefault(node.name, _Node())
        since = st.cursor is None  # the window back: it may hold lines already seen
        got = await self._steps(node, st)
        if not got:
            return
        now = self.clock.now()
        kept = [e for r in got for e in map(parse_event, r.lines) if e is not None]
        if got[-1].source == "dmesg":
            events = self._dmesg(st, kept, got[-1].counts, now)
        else:
            st.counts = None
            kept = capped(kept)  # the caps over every step: other lines first, as on the node
            events = kept + summaries(added(r.counts for r in got), kept)
            if since and st.seen:  # read again after a lost cursor: each line once
                known = {s.event.line for s in st.seen}
                events = [e for e in events if e.line not in known]
        behind = ""
        if full(got[-1], self.entries) and not got[-1].cursor_lost:
            n = sum(r.entries or 0 for r in got)
            behind = f"reading behind: {n} entries read in {len(got)} steps, more waiting"
        self._note(node.name, st, events, now, behind)
        new = [Seen(node.name, e, e.at if e.at is not None else now) for e in events]
        st.seen = recent([*st.seen, *new], now, self.window_s)
        st.fresh += new

    async def _steps(self, node: NodeConfig, st: _Node) -> list[KernelRead]:
        """Run the read's steps while each comes back full and the budget has room for one more;
        a step that fails after the first ends the read with what it has."""
        out: list[KernelRead] = []
        ends = self.clock.monotonic() + self.timeout_s
        took = 0.0
        while not out or (
            full(out[-1], self.entries)
            and not out[-1].cursor_lost
            and len(out) < self.steps
            and ends - self.clock.monotonic() > max(took, MIN_STEP_S)
        ):
            started = self.clock.monotonic()
            argv = kernlog_argv(st.cursor, self.window_s, self.entries)
            try:
                left = ends - started
                res = await self.transport.run(node, argv, timeout=left)
            except GpubotError as exc:
                self._say(node.name, st, f"kernel log not read: {exc}")
                return out
            got = parse_kernlog(res.stdout)
            if got.source is None:
                why = "; ".join(got.denied) or f"exit {res.exit_status}: {res.stderr[:200]}"
                self._say(node.name, st, f"kernel log unreadable: {why.strip()}")
                return out
            took = self.clock.monotonic() - started
            out.append(got)
            if got.cursor_lost:
                st.cursor = None
            elif got.cursor is not None:
                st.cursor = got.cursor
        return out

    def _note(
        self, node: str, st: _Node, events: Sequence[XidEvent], now: float, behind: str
    ) -> None:
        """Say what the read's caps dropped, and that it is behind (the node's note while it
        is in the window): a flood is summarised, never a silent loss or a silent lag."""
        app = sum(e.count for e in events if e.summary and is_app(e.key))
        other = sum(e.count for e in events if e.summary and not is_app(e.key))
        said = [f"{app} application-error lines"] if app else []
        said += [f"{other} other driver lines"] if other else []
        parts = [f"{' and '.join(said)} summarised"] if said else []
        parts += [behind] if behind else []
        if parts:
            st.note = (now, f"kernel log: {'; '.join(parts)}")
            log.warning("%s: %s", node, st.note[1])

    def _dmesg(
        self, st: _Node, kept: list[XidEvent], counts: Mapping[CountKey, int] | None, now: float
    ) -> list[XidEvent]:
        """dmesg: the lines newer than the last seen, and a summary of only what the caps
        dropped SINCE the previous read (its counts are the whole ring buffer's)."""
        since = st.last_at if st.last_at is not None else now - self.window_s  # first: the window
        new = [e for e in kept if e.at is not None and e.at > since]
        times = [e.at for e in kept if e.at is not None]
        if times:
            st.last_at = max([*times, since])
        if st.counts is None:  # the first read: the window's part of the buffer
            events = new + summaries(counts, kept, since)
        else:
            events = new + summaries(increase(counts, st.counts), new)
        st.counts = dict(counts or {})
        return events

    def _say(self, node: str, st: _Node, why: str) -> None:
        if why != st.said:
            log.warning("%s: %s", node, why)
            st.said = why

    def findings(self, snaps: Sequence[NodeSnapshot]) -> list[Finding]:
        """Return the findings of the window (counts new events). A node whose probe failed
        this sweep (its nvidia-smi, say, after an Xid 79) is mapped by its last table."""
        now = self.clock.now()
        for snap in snaps:
            self._last[snap.node] = snap
        seen: list[Seen] = []
        for name, st in self._nodes.items():
            st.seen = recent(st.seen, now, self.window_s)
            seen += st.seen
            self._count(name, self._last.get(name), st)
        return xid_findings(seen, self._last, now=now, window_s=self.window_s)

    def flag(self, snap: NodeSnapshot) -> NodeSnapshot:
        st = self._nodes.get(snap.node)
        if st is None:
            return snap
        serious: dict[str, list[int]] = {}
        for s in recent(st.seen, self.clock.now(), self.window_s):
            if not s.event.sxid and classify(s.event).serious:
                serious.setdefault(s.event.bus, []).append(s.event.code)
        snap = flag_snapshot(snap, serious)
        if st.note is not None and self.clock.now() - st.note[0] <= self.window_s:
            snap = replace(snap, notes=(*snap.notes, st.note[1]))
        return snap

    def _count(self, node: str, snap: NodeSnapshot | None, st: _Node) -> None:
        fresh, st.fresh = st.fresh, []
        if self.count is None:
            return
        gpus = {} if snap is None else bus_map(snap)
        for s in fresh:
            e = s.event
            gpu = None if e.sxid else gpus.get(e.bus)
            label = f"sxid:{e.code}" if e.sxid else str(e.code)
            for _ in range(min(e.count, MAX_COUNTED)):  # a summary: each line it holds
                self.count(node, "-" if gpu is None else str(gpu), label)


def full(got: KernelRead, entries: int) -> bool:
    """Whether a journal step took as many entries as it may: more may wait after it."""
    return got.entries is not None and got.entries >= entries


def capped(kept: Sequence[XidEvent]) -> list[XidEvent]:
    """Return the newest lines of each class over every step, in order, under the node's
    caps: other driver lines (an Xid 79) are never pushed out by application errors."""
    app = [e for e in kept if is_app(e.key)][-MAX_APP_LINES:]
    other = [e for e in kept if not is_app(e.key)][-MAX_LINES:]
    keep = {id(e) for e in (*app, *other)}
    return [e for e in kept if id(e) in keep]


def added(counts: Iterable[Mapping[CountKey, int] | None]) -> dict[CountKey, int]:
    out: Counter[CountKey] = Counter()
    for c in counts:
        out.update(c or {})
    return dict(out)


def watch_for(settings: Settings, transport: Transport, count: CountXid | None) -> XidWatch | None:
    """Return the sweep's watch when ``[sweep] kernel_log`` is on, else None; its ``flag``
    marks in a status the GPUs that had a serious Xid in the window (``core.health.flags``)."""
    cfg = settings.sweep
    if not cfg.kernel_log:
        return None
    timeout = min(settings.ssh.command_timeout_s, max(2.0, cfg.budget_s * 0.5))
    return XidWatch(transport, window_s=cfg.xid_window_s, timeout_s=timeout, count=count)
