"""The payload of a query's audit record (status, sweep), and reading it back.

A status names every node it asked. A sweep, every few minutes, names them only in a process's
first record; later ones hold their count, a digest of the list, and the nodes that failed or
changed, so a quiet sweep's record is small whatever the fleet's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

CHANGES = ("added", "removed", "recovered")  # what a sweep's record lists besides failures


def nodes_digest(nodes: Sequence[str]) -> str:
    """Return the digest of a node list (sha256 of the sorted names, one a line)."""
    return "sha256:" + hashlib.sha256("\n".join(sorted(nodes)).encode()).hexdigest()


def query_payload(
    kind: str,
    nodes: Sequence[str],
    failed: Mapping[str, str],
    seconds: float,
    changed: Mapping[str, Sequence[str]] | None,
) -> dict[str, Any]:
    """Return a query record's payload; with ``changed`` the nodes are counted, not named."""
    out: dict[str, Any] = {"query": kind, "failed": dict(failed), "seconds": round(seconds, 3)}
    if changed is None:
        return out | {"nodes": list(nodes)}
    unknown = set(changed) - set(CHANGES)
    if unknown:
        raise ValueError(f"unknown node changes {sorted(unknown)}: expected {CHANGES}")
    out |= {"node_count": len(nodes), "nodes_digest": nodes_digest(nodes)}
    return out | {k: sorted(changed[k]) for k in CHANGES if changed.get(k)}


def node_count(data: Mapping[str, Any]) -> int:
    """Return how many nodes a query record's payload covers (either shape)."""
    count = data.get("node_count")
    if isinstance(count, int):
        return count
    nodes = data.get("nodes")
    return len(nodes) if isinstance(nodes, list) else 0
