"""The cgroup paths that name a workload, one table drawn from the runtimes' modules.

Every pattern is matched over a whole path from the root of the hierarchy (see
``core.workload``: a user can create cgroups only inside their own delegated subtree, and a
container's root only inside its container's cgroup). The first pattern that matches wins:
the shapes stand by their ``Rank`` (a place only root makes, then a user's own subtree, the
user's session, the known units that are no workload, any other service), each rank's in the
runtimes' order. A ``tail`` group marks a container's own subtree, where a container's root may
nest another container (docker-in-docker, a kind node's pods); a ``reason_*`` group marks a
known shape that is no workload gpubot may name, advise or stop.

Each shape's public source is in its runtime's module (``core/runtimes/*.py``); the real samples
are in tests/corpus/. A runtime's own units (``containerd.service``, ``slurmstepd.scope`` ...,
each runtime's ``daemons``) hold only its daemons and shims: one rule here makes them ``other``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpubot.core.runtimes import RUNTIMES
from gpubot.core.runtimes.base import OTHER, ROOT_SLICES, TAIL, Rank, Runtime, Shape
from gpubot.core.runtimes.slurm import SLUID

__all__ = ["DAEMON_REASON", "MAX_NEST", "REASONS", "SHAPES", "SLUID"]

DAEMON_REASON = "runtime daemon's own unit"
MAX_NEST = 4  # levels of containers in containers read; deeper ones name the level reached


def daemon_rule(runtimes: Sequence[Runtime]) -> Shape:
    """One shape for every runtime's own units: a process found there is a daemon or a shim
    (containerd-shim, conmon, slurmstepd), never a workload; stopping the unit would stop every
    container or job on the node."""
    units = "|".join(d for r in runtimes for d in r.daemons)
    return Shape(f"{ROOT_SLICES}(?P<reason_daemon>{units})" + TAIL, Rank.UNIT, DAEMON_REASON)


def ordered(runtimes: Sequence[Runtime]) -> list[tuple[str, Shape]]:
    """Return ``(kind, shape)`` of every runtime's shapes and the daemon rule, first match first.

    A shape with a reason is ``other``'s, whichever runtime gives it. The daemon rule is the
    first of its rank.
    """
    pairs = [(OTHER, daemon_rule(runtimes))]
    pairs += [(OTHER if s.reason else r.kind, s) for r in runtimes for s in r.shapes]
    return sorted(pairs, key=lambda p: p[1].rank)


_ORDERED = ordered(RUNTIMES)

# (kind, pattern over the whole path); the first that matches wins.
SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(s.pattern + r"\Z")) for kind, s in _ORDERED
)

# The reason of each ``reason_*`` group: a shape that is known but is no workload.
REASONS: dict[str, str] = {
    g: s.reason
    for _, s in _ORDERED
    if s.reason
    for g in re.compile(s.pattern).groupindex
    if g.startswith("reason_")
}
