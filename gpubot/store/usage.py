"""GPU-hours in the database (``core.usage.hours``): each sweep's buckets, sweeps and gaps.

A sweep's GPU-hours are added in one transaction. A report reads the buckets of its hours, the
sweeps and the gaps, never the samples, so its cost follows the hours asked, not the history.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, RowMapping, and_, func, select

from gpubot.core.usage.hours import (
    KINDS,
    NODE_ROW,
    Gap,
    SweepSample,
    Usage,
    UsageRecords,
    UsageSweep,
    from_future,
    tally,
)
from gpubot.store.engine import Part, reads, write_rows, writes
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import gpu_usage as u
from gpubot.store.tables import gpu_usage_last as last
from gpubot.store.tables import usage_gaps as gaps
from gpubot.store.tables import usage_sweeps as sweeps

COLUMNS = (*(f"{k}_ms" for k in KINDS), "samples")


class DbUsage(Part):
    """GPU-hours in the database; every method is async and raises ``StoreError``."""

    @writes("cannot record GPU-hours")
    def add_sweep(self, conn: Connection, sweep: UsageSweep) -> int:
        """Add one sweep's GPU-hours (one transaction); return the buckets written."""
        prev_gpu = {(n, int(g)): unix_of(t) for n, g, t in conn.execute(select(last))}
        prev_node: dict[str, float] = {}
        for (node, _), at in prev_gpu.items():
            prev_node[node] = max(at, prev_node.get(node, at))
        sample = SweepSample(
            sweep.at, sweep.states, prev_gpu, prev_node, sweep.claims, sweep.interval_s
        )
        out = tally(sample)
        _write_buckets(conn, out.rows.values())
        _write_last(conn, sweep, prev_gpu)
        conn.execute(sweeps.insert(), [{"at": text_of(sweep.at)}])
        if out.gaps:
            rows = [
                {"node": g.node, "start_at": text_of(g.start), "end_at": text_of(g.end or 0)}
                for g in out.gaps
            ]
            conn.execute(gaps.insert(), rows)
        return len(out.rows)

    @reads("cannot read GPU-hours")
    def records(
        self, conn: Connection, since: float, until: float, *, by: str = ""
    ) -> UsageRecords:
        """Return the buckets of the hours in [since, until), and what they rest on; ``by``
        "node", "holder" or "node-holder" (each holder's per node) has the database sum them,
        since a fleet's week is millions."""
        lo, hi = text_of(since), text_of(until)
        rows = _summed(conn, lo, hi, int(since), by)
        count = select(func.count()).select_from(sweeps)
        n = conn.execute(count.where(sweeps.c.at >= lo, sweeps.c.at < hi)).scalar() or 0
        found = conn.execute(
            select(gaps.c.node, gaps.c.start_at, gaps.c.end_at)
            .where(and_(gaps.c.end_at > lo, gaps.c.start_at < hi))
            .order_by(gaps.c.start_at, gaps.c.node)
        )
        between = tuple(Gap(n_, unix_of(s), unix_of(e)) for n_, s, e in found)
        seen = select(last.c.node, func.max(last.c.last_at)).group_by(last.c.node)
        last_seen = {node: unix_of(at) for node, at in conn.execute(seen)}
        return UsageRecords(rows, int(n), between, last_seen)


def _summed(conn: Connection, lo: str, hi: str, since: int, by: str) -> tuple[Usage, ...]:
    """Return the buckets of [lo, hi), or their sums per node or per holder."""
    when = (u.c.hour >= lo, u.c.hour < hi)
    if not by:
        q = select(u).where(*when).order_by(u.c.hour, u.c.node, u.c.gpu_index, u.c.holder)
        return tuple(_usage_of(r._mapping) for r in conn.execute(q))
    sums = [func.sum(u.c[c]) for c in COLUMNS]
    if by == "node-holder":  # each holder's sums per node
        keys = (u.c.node, u.c.holder)
        q = select(*keys, *sums).where(*when, u.c.holder != NODE_ROW).group_by(*keys)
        return tuple(
            Usage(since, node, 0, holder, *(int(f or 0) for f in figures))
            for node, holder, *figures in conn.execute(q.order_by(*keys))
        )
    key = u.c.node if by == "node" else u.c.holder
    mine = u.c.holder == NODE_ROW if by == "node" else u.c.holder != NODE_ROW
    q = select(key, *sums).where(*when, mine).group_by(key).order_by(key)
    out = []
    for name, *figures in conn.execute(q):
        node, holder = (name, NODE_ROW) if by == "node" else ("", name)
        out.append(Usage(since, node, 0, holder, *(int(f or 0) for f in figures)))
    return tuple(out)


def _usage_of(m: RowMapping) -> Usage:
    return Usage(
        int(unix_of(m["hour"])),
        str(m["node"]),
        int(m["gpu_index"]),
        str(m["holder"]),
        *(int(m[c]) for c in COLUMNS),
    )


def _write_buckets(conn: Connection, rows: Iterable[Usage]) -> None:
    """Add to the buckets that exist, insert the others."""
    todo = list(rows)
    hours = sorted({r.hour for r in todo})
    have: set[tuple[int, str, int, str]] = set()
    for h in hours:
        q = select(u.c.node, u.c.gpu_index, u.c.holder).where(u.c.hour == text_of(h))
        have |= {(h, n, int(g), user) for n, g, user in conn.execute(q)}
    old = [_values(r) for r in todo if r.key in have]
    new = [_values(r) for r in todo if r.key not in have]
    write_rows(conn, u, ("hour", "node", "gpu_index", "holder"), old, new, add=True)


def _values(r: Usage) -> dict[str, object]:
    key = {"hour": text_of(r.hour), "node": r.node, "gpu_index": r.gpu, "holder": r.user}
    return key | {f"{k}_ms": getattr(r, k) for k in KINDS} | {"samples": r.samples}


def _write_last(conn: Connection, sweep: UsageSweep, prev: dict[tuple[str, int], float]) -> None:
    """Move each sampled GPU's latest sample to this sweep's time: never back, except from the
    future (a wall clock stepped back), which is no baseline."""
    old, new = [], []
    for st in sweep.states:
        key = (st.node, st.gpu)
        row = {"node": st.node, "gpu_index": st.gpu, "last_at": text_of(sweep.at)}
        if key not in prev:
            new.append(row)
        elif sweep.at > prev[key] or from_future(prev[key], sweep.at, sweep.interval_s):
            old.append(row)
    write_rows(conn, last, ("node", "gpu_index"), old, new)
