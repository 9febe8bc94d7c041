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
from gpubot.store.engine import Part, guard, read_tx, reads, write_tx, writes
from gpubot.store.idle_runs import sample_of
from gpubot.store.records import text_of
from gpubot.store.tables import gpu_samples as t
from gpubot.store.waits import in_thread


class DbSamples(Part):
    """GPU samples in the database; every method is async and raises ``StoreError``."""

    async def advance_idle(
        self,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        """Store one sweep's samples and advance the idle and holder runs in one transaction;
        return since when each GPU and holder has been idle, counting from ``keep_from``."""
        return await in_thread(self._advance, list(samples), rule, keep_from, looked)

    async def idle_since(
        self,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        """Return what ``advance_idle`` would, storing nothing (a status's GPU-hours)."""
        return await in_thread(self._peek, list(samples), rule, keep_from, looked)

    async def add_samples(self, samples: Sequence[GpuSample]) -> None:
        """Store samples taken outside a sweep; their runs are rebuilt at the next sweep."""
        if samples:
            await in_thread(self._add, list(samples))

    async def samples_since(
        self, since: float, *, gpus: Collection[tuple[str, int]] | None = None
    ) -> list[GpuSample]:
        """Return the samples taken at or after ``since`` (of ``gpus`` only), by GPU and time."""
        if gpus is not None and not gpus:
            return []
        return await self._since(since, None if gpus is None else list(gpus))

    @writes("cannot prune GPU samples")
    def prune_samples(self, conn: Connection, before: float, *, limit: int | None = None) -> int:
        """Delete at most ``limit`` samples before ``before`` and the runs not seen since."""
        holder_runs.prune(conn, before)
        return idle_runs.prune(conn, before, limit)

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _advance(  # run by name: benchmarks/first_sweep.py times the store thread in this call
        self, samples: list[GpuSample], rule: RunRule, keep_from: float, looked: Looked | None
    ) -> IdleNow:
        with guard("cannot record GPU samples"), write_tx(self._engine) as conn:
            since = idle_runs.advance_all(conn, samples, rule, keep_from)
            held = {} if looked is None else holder_runs.fold(conn, looked, store=True)
            return IdleNow(since, held)

    def _peek(
        self, samples: list[GpuSample], rule: RunRule, keep_from: float, looked: Looked | None
    ) -> IdleNow:
        with guard("cannot read GPU samples"), read_tx(self._engine) as conn:
            since = idle_runs.peek(conn, samples, rule, keep_from)
            held = {} if looked is None else holder_runs.fold(conn, looked, store=False)
            return IdleNow(since, held)

    def _add(self, samples: list[GpuSample]) -> None:
        rows = [idle_runs.sample_row(s) for s in samples]
        with guard("cannot record GPU samples"), write_tx(self._engine) as conn:
            conn.execute(t.insert(), rows)
            idle_runs.forget(conn, {s.key for s in samples})

    @reads("cannot read GPU samples")
    def _since(
        self, conn: Connection, since: float, gpus: list[tuple[str, int]] | None
    ) -> list[GpuSample]:
        query = select(t).where(t.c.taken_at >= text_of(since))
        if gpus is not None:
            query = query.where(tuple_(t.c.node, t.c.gpu_index).in_(sorted(set(gpus))))
        query = query.order_by(t.c.node, t.c.gpu_index, t.c.taken_at, t.c.id)
        return [sample_of(row) for row in conn.execute(query)]
