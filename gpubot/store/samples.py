"""Per-GPU samples of every sweep, with the idle and holder runs advanced in one transaction,
so the idle check reads one row per GPU and holder, never the history. Samples are pruned by
age in bounded batches. Times are fixed-width UTC text, so comparing text compares time.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import Connection, select, tuple_

from gpubot.core.usage.holder_runs import IdleNow, Looked
from gpubot.core.usage.idle import GpuSample
from gpubot.core.usage.idle_runs import RunRule
from gpubot.store import holder_runs, idle_runs
from gpubot.store.engine import Part, guard, reads, write_tx, writes
from gpubot.store.idle_runs import sample_of
from gpubot.store.records import text_of
from gpubot.store.tables import gpu_samples as t
from gpubot.store.waits import in_thread


class DbSamples(Part):
    """The ``SampleStore`` (``core.ports``) on one engine."""

    async def advance_idle(
        self,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        return await in_thread(self._advance, list(samples), rule, keep_from, looked)

    @reads("cannot read GPU samples")
    def idle_since(
        self,
        conn: Connection,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        """Return what ``advance_idle`` would, storing nothing (a status's GPU-hours)."""
        since = idle_runs.peek(conn, samples, rule, keep_from)
        held = {} if looked is None else holder_runs.fold(conn, looked, store=False)
        return IdleNow(since, held)

    async def add_samples(self, samples: Sequence[GpuSample]) -> None:
        """Their runs are rebuilt at the next sweep."""
        if samples:
            await self._add(samples)

    async def samples_since(
        self, since: float, *, gpus: Collection[tuple[str, int]] | None = None
    ) -> list[GpuSample]:
        """Of ``gpus`` only, if given."""
        if gpus is not None and not gpus:
            return []
        return await self._since(since, None if gpus is None else sorted(set(gpus)))

    @writes("cannot prune GPU samples")
    def prune_samples(self, conn: Connection, before: float, *, limit: int | None = None) -> int:
        """Also delete the runs not seen since ``before``."""
        holder_runs.prune(conn, before)
        return idle_runs.prune(conn, before, limit)

    def _advance(  # run by name: benchmarks/first_sweep.py times the store thread in this call
        self, samples: list[GpuSample], rule: RunRule, keep_from: float, looked: Looked | None
    ) -> IdleNow:
        with guard("cannot record GPU samples"), write_tx(self._engine) as conn:
            since = idle_runs.advance_all(conn, samples, rule, keep_from)
            held = {} if looked is None else holder_runs.fold(conn, looked, store=True)
            return IdleNow(since, held)

    @writes("cannot record GPU samples")
    def _add(self, conn: Connection, samples: Sequence[GpuSample]) -> None:
        conn.execute(t.insert(), [idle_runs.sample_row(s) for s in samples])
        idle_runs.forget(conn, {s.key for s in samples})

    @reads("cannot read GPU samples")
    def _since(
        self, conn: Connection, since: float, gpus: list[tuple[str, int]] | None
    ) -> list[GpuSample]:
        query = select(t).where(t.c.taken_at >= text_of(since))
        if gpus is not None:
            query = query.where(tuple_(t.c.node, t.c.gpu_index).in_(gpus))
        query = query.order_by(t.c.node, t.c.gpu_index, t.c.taken_at, t.c.id)
        return [sample_of(row) for row in conn.execute(query)]
