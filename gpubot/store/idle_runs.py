"""Each GPU's idle run (``core.idle_runs``) in ``gpu_idle``: read, advanced, rebuilt (sync).

A sweep advances the runs in the transaction that stores its samples (``advance``), reading
one row per GPU and never the samples, except for the few GPUs whose run cannot be folded
forward (no row yet, a sample out of order, another rule): those are rebuilt from their own
samples, in one query. A status reads the runs without writing (``peek``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, Row, bindparam, delete, func, select, tuple_

from gpubot.core.idle import GpuKey, GpuSample
from gpubot.core.idle_runs import IdleRun, RunRule, advance, can_advance, kept_since, rebuild
from gpubot.store.records import iso
from gpubot.store.tables import gpu_idle as r
from gpubot.store.tables import gpu_samples as t

Since = dict[tuple[str, int], float]  # (node, gpu) -> since when held idle


def text_of(unix: float) -> str:
    """Return the store's UTC text of a unix time."""
    return iso(datetime.fromtimestamp(unix, UTC))


def unix_of(text: str) -> float:
    """Return the unix time of the store's UTC text (``fromisoformat``: fast, the same value)."""
    return datetime.fromisoformat(text).timestamp()


def sample_of(row: Row[object]) -> GpuSample:
    """Build a ``GpuSample`` from a ``gpu_samples`` row."""
    m = row._mapping
    return GpuSample(
        str(m["node"]),
        int(m["gpu_index"]),
        str(m["gpu_uuid"]),
        unix_of(str(m["taken_at"])),
        m["utilization_pct"],
        m["memory_used_mib"],
    )


def read_runs(conn: Connection) -> dict[GpuKey, IdleRun]:
    """Return every GPU's run (one row per GPU, whatever the samples hold)."""
    out: dict[GpuKey, IdleRun] = {}
    for node, gpu, uuid, last, since, min_mib, gap in conn.execute(select(r)):
        rule = RunRule(int(min_mib), int(gap))
        run = IdleRun(
            node, int(gpu), uuid, unix_of(last), None if since is None else unix_of(since), rule
        )
        out[run.key] = run
    return out


def _history(
    conn: Connection, keys: Collection[GpuKey], keep_from: float
) -> dict[GpuKey, list[GpuSample]]:
    """Return the kept samples of ``keys`` (one query; only for runs that must be rebuilt)."""
    out: dict[GpuKey, list[GpuSample]] = {k: [] for k in keys}
    if not keys:
        return out
    pairs = sorted({(n, g) for n, g, _ in keys})
    q = select(t).where(
        t.c.taken_at >= text_of(keep_from), tuple_(t.c.node, t.c.gpu_index).in_(pairs)
    )
    for row in conn.execute(q):
        s = sample_of(row)
        if s.key in out:
            out[s.key].append(s)
    return out


def _first_kept(conn: Connection, key: GpuKey, keep_from: float) -> float | None:
    """Return the time of ``key``'s first sample kept (an indexed min; None: none)."""
    node, gpu, uuid = key
    q = select(func.min(t.c.taken_at)).where(
        t.c.node == node,
        t.c.gpu_index == gpu,
        t.c.gpu_uuid == uuid,
        t.c.taken_at >= text_of(keep_from),
    )
    first = conn.execute(q).scalar()
    return None if first is None else unix_of(str(first))


def _fold(
    conn: Connection,
    samples: Sequence[GpuSample],
    runs: Mapping[GpuKey, IdleRun],
    rule: RunRule,
    keep_from: float,
) -> tuple[dict[GpuKey, IdleRun], Since]:
    """Return each sample's GPU run after it, and since when each held-idle GPU is held idle."""
    redo = [s.key for s in samples if s.key not in runs or not can_advance(runs[s.key], s, rule)]
    history = _history(conn, redo, keep_from)
    after: dict[GpuKey, IdleRun] = {}
    since: Since = {}
    for s in samples:
        if s.key in history:
            earlier = [h for h in history[s.key] if h.taken_at < s.taken_at]
            now_run = rebuild([*earlier, s], rule)
            later = rebuild([*history[s.key], s], rule)
        else:
            now_run = later = advance(runs[s.key], s, rule)
        assert now_run is not None and later is not None  # both hold ``s`` at least
        after[s.key] = later
        if now_run.idle_since is None:
            continue
        start = now_run.idle_since
        if start < keep_from:  # older than the samples kept: the history starts later
            start = kept_since(start, _first_kept(conn, s.key, keep_from), s.taken_at)
        since[(s.node, s.gpu)] = start
    return after, since


def _unique(samples: Iterable[GpuSample]) -> list[GpuSample]:
    """Return one sample per GPU (the first), as one sweep sees each GPU once."""
    seen: dict[GpuKey, GpuSample] = {}
    for s in samples:
        seen.setdefault(s.key, s)
    return list(seen.values())


def peek(conn: Connection, samples: Sequence[GpuSample], rule: RunRule, keep_from: float) -> Since:
    """Return since when the held-idle GPUs of ``samples`` are held idle; write nothing."""
    return _fold(conn, _unique(samples), read_runs(conn), rule, keep_from)[1]


def advance_all(
    conn: Connection, samples: Sequence[GpuSample], rule: RunRule, keep_from: float
) -> Since:
    """Store one sweep's samples and advance their runs (in the caller's write transaction)."""
    unique = _unique(samples)
    runs = read_runs(conn)
    after, since = _fold(conn, unique, runs, rule, keep_from)
    if samples:
        conn.execute(t.insert(), [sample_row(s) for s in samples])
    _write_runs(conn, after, runs)
    return since


def sample_row(s: GpuSample) -> dict[str, object]:
    return {
        "node": s.node,
        "gpu_index": s.gpu,
        "gpu_uuid": s.uuid,
        "taken_at": text_of(s.taken_at),
        "utilization_pct": s.utilization_pct,
        "memory_used_mib": s.memory_used_mib,
    }


def _run_row(run: IdleRun) -> dict[str, object]:
    return {
        "k_node": run.node,
        "k_gpu": run.gpu,
        "k_uuid": run.uuid,
        "last_at": text_of(run.last_at),
        "idle_since": None if run.idle_since is None else text_of(run.idle_since),
        "min_mib": run.rule.min_mib,
        "max_gap_ms": run.rule.max_gap_ms,
    }


def _write_runs(
    conn: Connection, after: Mapping[GpuKey, IdleRun], before: Mapping[GpuKey, IdleRun]
) -> None:
    """Update the runs that were there, insert the new ones (two batched statements)."""
    old = [_run_row(a) for k, a in after.items() if k in before]
    new = [_run_row(a) for k, a in after.items() if k not in before]
    if old:
        q = (
            r.update()
            .where(
                r.c.node == bindparam("k_node"),
                r.c.gpu_index == bindparam("k_gpu"),
                r.c.gpu_uuid == bindparam("k_uuid"),
            )
            .values(
                last_at=bindparam("last_at"),
                idle_since=bindparam("idle_since"),
                min_mib=bindparam("min_mib"),
                max_gap_ms=bindparam("max_gap_ms"),
            )
        )
        conn.execute(q, old)
    if new:
        rows = [
            {"node": x.pop("k_node"), "gpu_index": x.pop("k_gpu"), "gpu_uuid": x.pop("k_uuid"), **x}
            for x in new
        ]
        conn.execute(r.insert(), rows)


def forget(conn: Connection, keys: Collection[GpuKey]) -> None:
    """Drop the runs of ``keys`` (samples stored without a sweep: rebuilt at the next one)."""
    for node, gpu, uuid in sorted(set(keys)):
        conn.execute(delete(r).where(r.c.node == node, r.c.gpu_index == gpu, r.c.gpu_uuid == uuid))


def prune(conn: Connection, before: float, limit: int | None) -> int:
    """Delete up to ``limit`` samples taken before ``before`` (None: all), and the runs of GPUs
    not seen since; return how many samples went."""
    cut = text_of(before)
    old = t.c.taken_at < cut
    if limit is None:
        gone = conn.execute(delete(t).where(old)).rowcount
    else:
        batch = select(t.c.id).where(old).order_by(t.c.taken_at).limit(limit).scalar_subquery()
        gone = conn.execute(delete(t).where(t.c.id.in_(batch))).rowcount
    conn.execute(delete(r).where(r.c.last_at < cut))
    return int(gone or 0)
