"""The site's Prometheus read for a fleet summary (``StatusService.summary``), and the note of the
nodes it cannot vouch for.

At 20,000 GPUs the answers are some 12 MB of JSON and their fold a few hundred milliseconds of
CPU (``benchmarks/prom_summary.py``): the fold runs in the worker thread (``services.offload``),
as the probes' parsing does, so the loop is not held.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.core.models import NodeConfig
from gpubot.core.ports import PromSource
from gpubot.core.telemetry import PromNode, PromSettings, summarize
from gpubot.errors import PrometheusFailed
from gpubot.services.offload import off_loop


async def read_prometheus(
    prom: PromSource | None, cfg: PromSettings, nodes: Sequence[NodeConfig]
) -> tuple[dict[str, PromNode], list[str]]:
    """The fresh answers of ``nodes`` by name, and the one note of those left to SSH: none
    answered within ``cfg.max_age_s``, no server named, or the server failed."""
    if not nodes:
        return {}, []
    if prom is None:
        return {}, [f"no [prometheus] url: {len(nodes)} node(s) read over SSH"]
    try:
        vectors = await prom.summary_vectors()
    except PrometheusFailed as exc:
        return {}, [f"{exc}: {len(nodes)} node(s) read over SSH"]
    found = await off_loop(summarize, vectors, cfg.labels)
    fresh = {
        n.name: found[n.name]
        for n in nodes
        if n.name in found and found[n.name].age_s <= cfg.max_age_s
    }
    left = [n.name for n in nodes if n.name not in fresh]
    if not left:
        return fresh, []
    shown = ", ".join(left[:5]) + (f" (+{len(left) - 5})" if len(left) > 5 else "")
    return fresh, [
        f"prometheus {prom.url}: no answer, or one older than {cfg.max_age_s:g} s, "
        f"for {len(left)} node(s): {shown}: read over SSH"
    ]
