"""How many SSH connections gpubot's descriptor limit allows, and the lines that say so.

Each node's connection is one descriptor. Past the soft limit, connections failed with
``EMFILE``, their nodes looked unreachable and the database could fail too. So the soft limit is
raised to the hard one at start, as servers do, and the pool keeps at most ``connection_cap``:
the limit less a reserve for everything else. A larger fleet still answers, with idle
connections closed and reopened. Pure arithmetic.
"""

from __future__ import annotations

# Kept beyond SSH: stdio, the loop, the database pool, Slack, metrics, logs, known_hosts.
RESERVE = 64
# The target when the hard limit is unlimited: Linux refuses more than fs.nr_open's default.
UNLIMITED_TARGET = 1 << 20


def raised_to(soft: int, hard: int | None) -> int:
    """Return the soft limit to set: the hard one (``None``: unlimited), never lower than now."""
    target = UNLIMITED_TARGET if hard is None else hard
    return max(soft, target)


def connection_cap(soft: int) -> int:
    """Return how many SSH connections the soft limit ``soft`` allows (>= 1): the limit less a
    reserve of ``RESERVE`` or an eighth, for everything else."""
    return max(1, soft - max(RESERVE, soft // 8))


def raised_line(before: int, after: int, hard: int | None) -> str:
    """Return the one line logged at start: what the soft descriptor limit is now."""
    top = "unlimited" if hard is None else str(hard)
    if after > before:
        change = f"raised from {before} to {after}"
    else:
        change = f"left at {after}" + (" (the hard limit)" if hard == after else "")
    return (
        f"descriptor limit: soft {change}, hard {top}: up to {connection_cap(after)} "
        "SSH connections at once"
    )


def fleet_line(nodes: int, soft: int) -> str | None:
    """Return the one line that says the fleet is larger than the limit allows, or None."""
    cap = connection_cap(soft)
    if nodes <= cap:
        return None
    return (
        f"{nodes} nodes but the descriptor limit ({soft}) allows {cap} SSH connections: "
        "idle ones are closed and reopened as needed (slower); raise LimitNOFILE "
        f"to at least {needed(nodes)} to keep one per node"
    )


def needed(nodes: int) -> int:
    """Return the smallest soft limit that allows ``nodes`` SSH connections."""
    lo, hi = 1, 2 * max(1, nodes) + 2 * RESERVE  # connection_cap never falls as the limit grows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if connection_cap(mid) < nodes else (lo, mid)
    return lo
