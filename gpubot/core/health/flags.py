"""The health flag of a GPU with a recent serious Xid: ``xid-79`` beside it in every table.

Pure. The flag joins the GPU's own flags (``GpuInfo.flags``, shown by every status table and in
``--json``), so no front end changes. Serious is the table's say (``XidClass.serious``): not the
job's own, not counted-only. It is read from what the sweeps of this process saw in the window
(``services.xid_watch``): a status never reads the kernel log itself, so it stays one exec.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpubot.core.health.kernlog import gpu_bus
from gpubot.core.models import NodeSnapshot


def flag_snapshot(snap: NodeSnapshot, serious: Mapping[str, Iterable[int]]) -> NodeSnapshot:
    """Return ``snap`` with ``xid-N`` flags on the GPUs whose bus id has serious codes."""
    if not serious:
        return snap
    gpus = []
    for g in snap.gpus:
        bus = gpu_bus(g.bus_id)
        codes = sorted(set(serious.get(bus, ()) if bus else ()))  # each once, in code order
        extra = [f"xid-{c}" for c in codes if f"xid-{c}" not in g.flags]
        gpus.append(replace(g, flags=(*g.flags, *extra)) if extra else g)
    return replace(snap, gpus=tuple(gpus))
