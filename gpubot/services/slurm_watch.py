"""The sweep's look at Slurm: remembers since when each allocated GPU has gone unused, and
turns the snapshots' Slurm views into findings (``core.slurm.findings``).

The memory is this process's: after a restart an unused allocation's window starts again
(later, never earlier, so nobody is accused on time gpubot did not see).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.core.findings import Finding
from gpubot.core.models import NodeSnapshot
from gpubot.core.slurm import SlurmSettings
from gpubot.core.slurm.alloc import readable
from gpubot.core.slurm.findings import UnusedKey, find_slurm, unused_now


class SlurmWatch:
    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self._since: dict[UnusedKey, float] = {}

    async def findings(self, snaps: Sequence[NodeSnapshot], at: float) -> list[Finding]:
        now = unused_now(snaps)
        swept = {s.node for s in snaps if readable(s.slurm)}
        kept = {k: v for k, v in self._since.items() if k[0] not in swept}  # nodes not seen
        for key, start in now.items():
            first = self._since.get(key, at)
            kept[key] = first if start is None else max(first, start)
        self._since = kept
        return find_slurm(snaps, self._since, self.settings.unused_after_s, at)
