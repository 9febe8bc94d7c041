"""Names for workloads: one bounded exec per runtime and probe, batched for all ids.

``enrich_argv`` builds the command, ``parse_enrichment`` reads its standard output into
``Found`` records, ``apply_enrichment`` puts a record on a ``Workload`` and decides its owner,
and ``attribute`` names and owns every workload of a snapshot. Each runtime's lookup (its argv,
parser and how a record lands on a workload, with the formats' sources) is in its module in
``core.runtimes``; this module only iterates their list. Everything a runtime prints about a
workload is hostile: any doubt drops the record, and that workload's name is unknown, never
someone else's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpubot.core.models import NodeSnapshot
from gpubot.core.names import SUDO
from gpubot.core.runtimes import LOOKUPS, find_runtime
from gpubot.core.runtimes.base import Found, Lookup, Workload
from gpubot.core.workload import decide_owner

RUNTIMES = tuple(LOOKUPS)  # the tools a node's settings may list, in the list's order


def enrich_argv(runtime: str, ids: Sequence[str], *, timeout_s: float, sudo: bool) -> list[str]:
    """Return the argv that asks ``runtime`` about ``ids`` in one exec, under coreutils timeout.

    Every id must have the lookup's shape (container ids 64 lowercase hex digits, Slurm job ids
    digits); anything else (or no id at all: ``crictl inspect`` with none inspects every
    container) raises ValueError. ``sudo`` runs the runtime's CLI as ``sudo -n`` where its
    lookup takes it (never scontrol, which needs no root).
    """
    lookup = LOOKUPS.get(runtime)
    if lookup is None:
        raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
    asked = list(dict.fromkeys(ids))
    if not asked:
        raise ValueError(f"{runtime}: no ids to ask about")
    for i in asked:
        if not isinstance(i, str) or not lookup.ids.fullmatch(i):
            raise ValueError(f"{runtime}: refusing id {str(i)[:80]!r}")
    head = ["timeout", "-k", "1", f"{timeout_s:.3f}".rstrip("0").rstrip(".")]
    return [*head, *lookup.argv(asked, SUDO if sudo else ())]


def _lookup_of(kind: str | None) -> Lookup | None:
    runtime = find_runtime(kind)
    return runtime.lookup if runtime is not None else None


def enrich_target(w: Workload) -> tuple[str, str] | None:
    """Return ``(runtime, id)`` to look ``w`` up with, or None when no runtime can name it.

    A rootless container is left out: the system's daemon does not know it, and its owner
    comes from its user slice anyway. A container inside another is looked up by the outer
    one's id (the inner id was chosen inside the outer container: it could be another's).
    """
    outer = w.get("outer")
    if outer is not None:
        lookup = _lookup_of(w.get("outer_kind"))
        ok = lookup is not None and not w.get("rootless") and lookup.ids.fullmatch(outer)
        return (lookup.tool, outer) if ok and lookup is not None else None
    lookup = _lookup_of(w.kind)
    wid = lookup.target(w) if lookup is not None else None
    if lookup is None or wid is None or not lookup.ids.fullmatch(wid):
        return None
    return (lookup.tool, wid)


def parse_enrichment(runtime: str, stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    lookup = LOOKUPS.get(runtime)
    return lookup.parse(stdout, ids) if lookup is not None else {}


def apply_enrichment(
    w: Workload,
    found: Found | None,
    owner_label: str | None,
    uid_names: Mapping[int, str] | None = None,
) -> Workload:
    """Put what a runtime said on ``w`` and decide its owner (``decide_owner``).

    ``found`` None (not found, lookup failed or timed out) marks ``name_unknown``. A record that
    contradicts what root's cgroup path says (another uid, another pod) counts as not found.
    """
    names = dict(uid_names or {})
    if w.get("outer") is not None:  # the outer container's record: its name and owner label
        pod = w.get("outer_pod_uid")
        if found is not None and pod and found.pod_uid and found.pod_uid != pod:
            found = None
        label = dict(found.labels).get(owner_label or "") if found and owner_label else None
        outer = {"outer_name": found.name if found else None, f"label.{owner_label}": label}
        return decide_owner(w.with_detail(**outer), names, owner_label)
    lookup = _lookup_of(w.kind)
    if lookup is not None:
        if found is not None and lookup.contradicts(w, found):
            found = None
        w = (
            w.with_detail(name_unknown="yes")
            if found is None
            else lookup.apply(w, found, owner_label)
        )
    return decide_owner(w, names, owner_label)


def attribute(
    snap: NodeSnapshot, owner_label: str | None, named: Mapping[tuple[str, str, str], Workload] = {}
) -> NodeSnapshot:
    """Return ``snap`` with each process's workload named (``named``) and owned."""
    uid_names = {p.uid: p.user for p in snap.processes if p.uid is not None and p.user}
    procs = []
    for p in snap.processes:
        w = p.workload
        if w is not None:
            w = decide_owner(named.get(w.key, w), uid_names, owner_label)
        procs.append(p if w == p.workload else replace(p, workload=w))
    return replace(snap, processes=tuple(procs))
