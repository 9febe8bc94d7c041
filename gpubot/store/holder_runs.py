"""Since when each process has held its GPU (``core.usage.holder_runs``) in ``gpu_holders`` (sync).

The runs are folded in the transaction that advances the GPUs' idle runs, so every process that
sweeps carries on the same runs, and a status reads them without writing. A row is keyed by pid +
start ticks, never the pid alone; pid 0 keys the GPU's own looks.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Connection, bindparam, delete, select

from gpubot.core.usage.holder_runs import GPU_LOOKS, Held, HolderKey, Looked, OnGpu, on_gpu_since
from gpubot.store.engine import write_rows
from gpubot.store.records import text_of, unix_of
from gpubot.store.tables import gpu_holders as h

Runs = dict[HolderKey, OnGpu]

KEYS = ("node", "gpu_index", "pid", "start_ticks")
_KEY = tuple(h.c[k] == bindparam(k) for k in KEYS)


def _holder(pid: int, ticks: int) -> str:
    """Return the key's holder part of a row's pid and start ticks."""
    return GPU_LOOKS if pid == 0 else f"{pid}:{ticks}"


def _ids(holder: str) -> tuple[int, int]:
    """Return the pid and start ticks of a key's holder part (0, 0: the GPU's own looks)."""
    if holder == GPU_LOOKS:
        return 0, 0
    pid, ticks = holder.split(":")
    return int(pid), int(ticks)


def read(conn: Connection) -> Runs:
    out: Runs = {}
    for node, gpu, pid, ticks, since, last in conn.execute(select(h)):
        out[(str(node), int(gpu), _holder(int(pid), int(ticks)))] = OnGpu(
            unix_of(str(since)), unix_of(str(last))
        )
    return out


def _row(key: HolderKey, run: OnGpu | None = None) -> dict[str, object]:
    pid, ticks = _ids(key[2])
    row: dict[str, object] = {"node": key[0], "gpu_index": key[1], "pid": pid, "start_ticks": ticks}
    if run is not None:
        row |= {"since": text_of(run.since), "last_at": text_of(run.last_at)}
    return row


def write(
    conn: Connection, after: Mapping[HolderKey, OnGpu], before: Mapping[HolderKey, OnGpu]
) -> None:
    """Make the rows ``after`` from ``before`` in three batched statements."""
    gone = [_row(k) for k in before if k not in after]
    moved = [_row(k, a) for k, a in after.items() if k in before and before[k] != a]
    new = [_row(k, a) for k, a in after.items() if k not in before]
    if gone:
        conn.execute(delete(h).where(*_KEY), gone)
    write_rows(conn, h, KEYS, moved, new)


def fold(conn: Connection, looked: Looked, *, store: bool) -> Held:
    """Fold ``looked`` into the kept runs (``store``: keep the result, in the caller's write
    transaction); return since when each holder has held its GPU."""
    before = read(conn)
    after = looked.fold(before)
    if store:
        write(conn, after, before)
    return on_gpu_since(after)


def prune(conn: Connection, before: float) -> None:
    """Delete the runs not looked at since ``before`` (their nodes gone from the fleet)."""
    conn.execute(delete(h).where(h.c.last_at < text_of(before)))
