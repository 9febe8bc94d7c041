"""Per-GPU samples of every sweep (implements ``gpubot.core.ports.SampleStore``).

One batched insert per sweep; reads by time (and GPU); a prune by age. Times are the store's
fixed-width UTC text, so comparing text compares time on both databases.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, delete, select, tuple_

from gpubot.core.idle import GpuSample
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.records import iso, parse_iso
from gpubot.store.tables import gpu_samples as t
from gpubot.store.waits import in_thread


def _text(unix: float) -> str:
    return iso(datetime.fromtimestamp(unix, UTC))


class DbSamples:
    """GPU samples in the database; every method is async and raises ``StoreError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def add_samples(self, samples: Sequence[GpuSample]) -> None:
        """Store one sweep's samples (one batched insert)."""
        if samples:
            await in_thread(self._add, list(samples))

    async def samples_since(
        self, since: float, *, gpus: Collection[tuple[str, int]] | None = None
    ) -> list[GpuSample]:
        """Return the samples taken at or after ``since`` (of ``gpus`` only), by GPU and time."""
        if gpus is not None and not gpus:
            return []
        return await in_thread(self._since, since, None if gpus is None else list(gpus))

    async def prune_samples(self, before: float) -> int:
        """Delete the samples taken before ``before``; return how many went."""
        return await in_thread(self._prune, before)

    # -- synchronous parts, run in a worker thread ------------------------------------------

    def _add(self, samples: list[GpuSample]) -> None:
        rows = [
            {
                "node": s.node,
                "gpu_index": s.gpu,
                "gpu_uuid": s.uuid,
                "taken_at": _text(s.taken_at),
                "utilization_pct": s.utilization_pct,
                "memory_used_mib": s.memory_used_mib,
            }
            for s in samples
        ]
        with guard("cannot record GPU samples"), write_tx(self._engine) as conn:
            conn.execute(t.insert(), rows)

    def _since(self, since: float, gpus: list[tuple[str, int]] | None) -> list[GpuSample]:
        query = select(t).where(t.c.taken_at >= _text(since))
        if gpus is not None:
            query = query.where(tuple_(t.c.node, t.c.gpu_index).in_(sorted(set(gpus))))
        query = query.order_by(t.c.node, t.c.gpu_index, t.c.taken_at, t.c.id)
        with guard("cannot read GPU samples"), read_tx(self._engine) as conn:
            rows = conn.execute(query).all()
        return [
            GpuSample(
                r.node,
                int(r.gpu_index),
                r.gpu_uuid,
                parse_iso(r.taken_at).timestamp(),
                r.utilization_pct,
                r.memory_used_mib,
            )
            for r in rows
        ]

    def _prune(self, before: float) -> int:
        with guard("cannot prune GPU samples"), write_tx(self._engine) as conn:
            return int(conn.execute(delete(t).where(t.c.taken_at < _text(before))).rowcount or 0)
