"""Each GPU's uncorrectable ECC counts as the last sweep saw them: read once, when a process
first sweeps, and the changed rows written back after each alerting sweep in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Connection, bindparam, delete, select

from gpubot.core.health.findings import EccKey, EccSeen
from gpubot.store.engine import Part, guard, reads, write_tx
from gpubot.store.tables import gpu_ecc as t
from gpubot.store.waits import in_thread

# One statement for every row (executemany): a statement built per row held the store's thread
# for seconds on a large first sweep, and the loop waited for the interpreter lock.
_GONE = delete(t).where(
    t.c.node == bindparam("node"),
    t.c.gpu_uuid == bindparam("gpu_uuid"),
    t.c.counter == bindparam("counter"),
)


class DbEcc(Part):
    """ECC counts in the database; every method is async and raises ``StoreError``."""

    @reads("cannot read ECC counts")
    def ecc_counts(self, conn: Connection) -> dict[EccKey, EccSeen]:
        out: dict[EccKey, EccSeen] = {}
        for node, uuid, counter, count, grew_from, since in conn.execute(select(t)):
            grew = None if grew_from is None else int(grew_from)
            out[(str(node), str(uuid), str(counter))] = EccSeen(int(count), grew, int(since))
        return out

    async def put_ecc(self, counts: Mapping[EccKey, EccSeen]) -> None:
        if counts:
            await in_thread(self._put, dict(counts))

    def _put(self, counts: dict[EccKey, EccSeen]) -> None:  # by name: benchmarks/first_sweep.py
        rows = [
            {
                "node": k[0],
                "gpu_uuid": k[1],
                "counter": k[2],
                "count": v.count,
                "grew_from": v.grew_from,
                "sweeps_since": v.sweeps_since,
            }
            for k, v in sorted(counts.items())
        ]
        with guard("cannot record ECC counts"), write_tx(self._engine) as conn:
            conn.execute(_GONE, rows)  # portable upsert: the rows go, their new selves come
            conn.execute(t.insert(), rows)
