"""Which nodes a sweep probes over SSH: every node, but for those whose telemetry is
"prometheus" and that the site's Prometheus vouches for (issue 38).

Prometheus names candidates from its history (``core.telemetry.candidate_queries``: idle for the
window, memory held with no activity, a changed Xid, remapped rows pending, ECC growth, a GPU gone
from its exporter); only their nodes get the SSH probe, and every finding is decided from that
probe as in a full sweep: a scrape never decides. A node Prometheus did not answer for within
``[prometheus] max_age_s`` is swept over SSH, and so is every node when Prometheus is down or
errs, with one line saying so (logged, and in the sweep's notes). Nodes this process last found
something on or failed to reach, and those with open alerts, are probed whatever the scrape says:
only a probe that looked clears a finding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpubot.config import Settings
from gpubot.core.findings import Finding
from gpubot.core.models import NodeConfig
from gpubot.core.ports import PromSource
from gpubot.core.telemetry import PROMETHEUS, CandidateRule, candidates, summarize
from gpubot.errors import PrometheusFailed

log = logging.getLogger(__name__)

KEPT = "a finding or failure of an earlier sweep"  # why a node is probed whatever the scrape


@dataclass(frozen=True)
class Scope:
    """The nodes to probe, in inventory order, and why each narrowed one was named."""

    probe: tuple[NodeConfig, ...]
    named: Mapping[str, str] = field(default_factory=dict)  # node: the finding's source
    vouched: tuple[str, ...] = ()  # fresh in Prometheus, naming nothing: not probed
    notes: tuple[str, ...] = ()

    def tag(self, findings: Iterable[Finding]) -> tuple[Finding, ...]:
        """Say on each finding of a named node who named it (the probe found it)."""
        return tuple(
            replace(f, source=self.named[f.node]) if f.node in self.named else f for f in findings
        )


def rule_of(settings: Settings) -> CandidateRule:
    """The candidate rule of the settings: memory counts as held from the smaller of the orphan
    threshold and the idle rule's holder memory (either finding needs at least that much)."""
    sweep = settings.sweep
    held = min(sweep.orphan_threshold_mib, sweep.idle.min_mib)
    return CandidateRule(sweep.idle.window_s, sweep.interval_s, max(1, held))


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" (+{len(names) - 5})" if len(names) > 5 else "")


async def scope(
    settings: Settings,
    prom: PromSource | None,
    nodes: Sequence[NodeConfig],
    keep: Callable[[], Awaitable[Collection[str]]] | None = None,
) -> Scope:
    """Return the nodes a sweep probes. ``keep``: the nodes probed whatever Prometheus says
    (asked only when some node's telemetry is "prometheus")."""
    asked = [n for n in nodes if n.telemetry == PROMETHEUS]
    if not asked:
        return Scope(tuple(nodes))
    if prom is None:
        return _fallback(nodes, f"no [prometheus] url: {len(asked)} node(s) swept over SSH")
    cfg = settings.prometheus
    try:
        summary, named = await asyncio.gather(
            prom.summary_vectors(), prom.candidate_vectors(rule_of(settings))
        )
    except PrometheusFailed as exc:
        return _fallback(nodes, f"{exc}: {len(asked)} node(s) swept over SSH")
    kept = frozenset() if keep is None else await keep()
    found = summarize(summary, cfg.labels)
    fresh = {n.name for n in asked if n.name in found and found[n.name].age_s <= cfg.max_age_s}
    why = candidates(named, cfg.labels, {n: found[n] for n in fresh})
    notes = []
    if left := [n.name for n in asked if n.name not in fresh]:
        notes.append(
            f"prometheus {prom.url}: no answer, or one older than {cfg.max_age_s:g} s, for "
            f"{len(left)} node(s): {_shown(left)}: swept over SSH"
        )
        log.warning("%s", notes[0])
    probe, vouched, named_by = [], [], {}
    for n in nodes:
        if n.name not in fresh:
            probe.append(n)
        elif n.name in why:
            probe.append(n)
            said = "; ".join(why[n.name])
            named_by[n.name] = f"named by prometheus ({said}), confirmed over ssh"
        elif n.name in kept:
            probe.append(n)
            named_by[n.name] = f"named by {KEPT}, confirmed over ssh"
        else:
            vouched.append(n.name)
    return Scope(tuple(probe), named_by, tuple(vouched), tuple(notes))


def _fallback(nodes: Sequence[NodeConfig], note: str) -> Scope:
    log.warning("%s", note)
    return Scope(tuple(nodes), notes=(note,))
