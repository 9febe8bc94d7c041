"""Each GPU's idle run (``core.usage.idle_runs``) in ``gpu_idle``: read, advanced, rebuilt (sync).

A sweep advances the runs in the transaction that stores its samples, reading one row per GPU,
never the samples, except for runs that cannot be folded forward: those are rebuilt from their
own samples. A status reads the runs without writing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from sqlalchemy import Connection, Row, bindparam, delete, func, select

from gpubot.core.usage.idle import GpuKey, GpuSample, held_idle
from gpubot.core.usage.idle_runs import IdleRun, RunRule, advance, can_advance, kept_since
from gpubot.store.engine import write_rows
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import gpu_idle as r
from gpubot.store.tables import gpu_samples as t

Since = dict[tuple[str, int], float]  # (node, gpu) -> since when held idle
REBUILD_ROWS = 100_000  # samples read a sweep at most to rebuild runs


def sample_of(row: Row[object]) -> GpuSample:
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


# The rebuild's queries, built once with bound values (ties in stored order, as a stable sort):
# a statement built per GPU cost a large first sweep seconds of the store thread's time with the
# interpreter lock held.
_ONE_GPU = (
    t.c.node == bindparam("w_node"),
    t.c.gpu_index == bindparam("w_gpu"),
    t.c.gpu_uuid == bindparam("w_uuid"),
    t.c.taken_at >= bindparam("w_from"),
)
_WALK = (
    select(t.c.taken_at, t.c.utilization_pct, t.c.memory_used_mib)
    .where(*_ONE_GPU)
    .order_by(t.c.taken_at.desc(), t.c.id)
)
_WALK_BELOW = _WALK.where(t.c.taken_at < bindparam("w_below"))
_FIRST_KEPT = select(func.min(t.c.taken_at)).where(*_ONE_GPU)
_STREAM = {"yield_per": 256}


def _bound(key: GpuKey, keep_from: float) -> dict[str, object]:
    node, gpu, uuid = key
    return {"w_node": node, "w_gpu": gpu, "w_uuid": uuid, "w_from": text_of(keep_from)}


def _first_kept(conn: Connection, key: GpuKey, keep_from: float) -> float | None:
    """Return the time of ``key``'s first sample kept (an indexed min; None: none)."""
    first = conn.execute(_FIRST_KEPT, _bound(key, keep_from)).scalar()
    return None if first is None else unix_of(str(first))


def _walk_back(
    conn: Connection, key: GpuKey, rule: RunRule, keep_from: float, below: float | None
) -> tuple[float | None, float | None, int]:
    """Walk one GPU's kept samples newest first, as ``held_idle_since`` does; return (the first
    one's time, the run's start or None, rows read). A busy GPU costs one row."""
    params = _bound(key, keep_from)
    if below is not None:
        params["w_below"] = text_of(below)
    q = _WALK if below is None else _WALK_BELOW
    top: float | None = None
    since: float | None = None
    rows = 0
    result = conn.execute(q, params, execution_options=_STREAM)  # stopped early: few rows read
    try:
        for at_text, util, mem in result:
            rows += 1
            at = unix_of(at_text)
            top = at if top is None else top
            idle = util == 0 and mem is not None and mem >= rule.min_mib
            if not idle or (since is not None and since - at > rule.max_gap_s):
                break
            since = at
    finally:
        result.close()
    return top, since, rows


def _rebuild(
    conn: Connection, s: GpuSample, rule: RunRule, keep_from: float, stored: bool
) -> tuple[float | None, IdleRun | None, int]:
    """Return since when ``s``'s GPU is held idle, its run after ``s`` and the rows read."""
    since: float | None = None
    rows = 0
    if held_idle(s, rule.min_mib):
        top, start, rows = _walk_back(conn, s.key, rule, keep_from, s.taken_at)
        since = s.taken_at  # unless the samples before it carry the run on
        if top is not None and start is not None and s.taken_at - top <= rule.max_gap_s:
            since = start
    if not stored:
        return since, None, rows
    top, start, more = _walk_back(conn, s.key, rule, keep_from, None)
    assert top is not None  # ``s`` is stored
    return since, IdleRun(s.node, s.gpu, s.uuid, top, start, rule), rows + more


def _fold(
    conn: Connection,
    samples: Sequence[GpuSample],
    runs: Mapping[GpuKey, IdleRun],
    rule: RunRule,
    keep_from: float,
    *,
    stored: bool,
) -> tuple[dict[GpuKey, IdleRun], Since]:
    """Return each sample's GPU run after it, and since when each held-idle GPU is held idle.
    Rebuilds past ``REBUILD_ROWS`` wait for a later sweep; till then the GPU is not idle."""
    after: dict[GpuKey, IdleRun] = {}
    since: Since = {}
    budget = REBUILD_ROWS
    for s in samples:
        run = runs.get(s.key)
        start: float | None
        if run is not None and can_advance(run, s, rule):
            later: IdleRun | None = advance(run, s, rule)
            assert later is not None
            start = later.idle_since
            if start is not None and start < keep_from:  # older than the samples kept
                start = kept_since(start, _first_kept(conn, s.key, keep_from), s.taken_at)
        elif budget > 0:
            start, later, rows = _rebuild(conn, s, rule, keep_from, stored)
            budget -= rows
        else:
            continue
        if later is not None:
            after[s.key] = later
        if start is not None:
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
    if not samples:  # a look at the holders alone (``store.holder_runs``)
        return {}
    return _fold(conn, _unique(samples), read_runs(conn), rule, keep_from, stored=False)[1]


def advance_all(
    conn: Connection, samples: Sequence[GpuSample], rule: RunRule, keep_from: float
) -> Since:
    """Store one sweep's samples and advance their runs (in the caller's write transaction)."""
    unique = _unique(samples)
    runs = read_runs(conn)
    if samples:  # first: a rebuilt run ends at the newest sample, maybe this one
        conn.execute(t.insert(), [sample_row(s) for s in samples])
    after, since = _fold(conn, unique, runs, rule, keep_from, stored=True)
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
        "node": run.node,
        "gpu_index": run.gpu,
        "gpu_uuid": run.uuid,
        "last_at": text_of(run.last_at),
        "idle_since": None if run.idle_since is None else text_of(run.idle_since),
        "min_mib": run.rule.min_mib,
        "max_gap_ms": run.rule.max_gap_ms,
    }


def _write_runs(
    conn: Connection, after: Mapping[GpuKey, IdleRun], before: Mapping[GpuKey, IdleRun]
) -> None:
    old = [_run_row(a) for k, a in after.items() if k in before]
    new = [_run_row(a) for k, a in after.items() if k not in before]
    write_rows(conn, r, ("node", "gpu_index", "gpu_uuid"), old, new)


def forget(conn: Connection, keys: Collection[GpuKey]) -> None:
    """Drop the runs of ``keys`` (samples stored without a sweep: rebuilt at the next one)."""
    for node, gpu, uuid in sorted(set(keys)):
        conn.execute(delete(r).where(r.c.node == node, r.c.gpu_index == gpu, r.c.gpu_uuid == uuid))


def prune(conn: Connection, before: float, limit: int | None) -> int:
    """Delete up to ``limit`` samples before ``before`` and the runs of GPUs not seen since."""
    cut = text_of(before)
    old = t.c.taken_at < cut
    if limit is None:
        gone = conn.execute(delete(t).where(old)).rowcount
    else:
        batch = select(t.c.id).where(old).order_by(t.c.taken_at).limit(limit).scalar_subquery()
        gone = conn.execute(delete(t).where(t.c.id.in_(batch))).rowcount
    conn.execute(delete(r).where(r.c.last_at < cut))
    return int(gone or 0)
