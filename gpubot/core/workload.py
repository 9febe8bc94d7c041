"""Who a process works for: its container, Slurm job, pod, service or session, from its cgroup.

``parse_cgroup`` reads the whole ``/proc/PID/cgroup`` text. Every shape is matched from the
root of the hierarchy: a user may create cgroups only inside their own delegated subtree
(``/user.slice/user-UID.slice/user@UID.service/...``) and cannot move a process into a cgroup
elsewhere, so ``/system.slice/docker-ID.scope`` or ``/slurm/uid_U/job_J`` can only be where root
(dockerd, slurmd, the kubelet) put it. A lookalike inside a user's subtree is that user's
(a rootless container) or ``other``. Paths are as the kernel shows them to gpubot: relative to
the cgroup namespace of the probe, which must be the node's initial one.

The shapes, each with its public source, are the runtimes' (``core.runtimes``; real samples in
tests/corpus/), drawn into one table here (``SHAPES``); what a kind means (owner rule, stop
command, restart rule) is its runtime's too. The first shape that matches wins: they stand by
their ``Rank`` (a place only root makes, then a user's own subtree, the user's session, the
known units that are no workload, any other service), each rank's in the runtimes' order. A
``tail`` group marks a container's own subtree, where its root may nest another container
(docker-in-docker, a kind node's pods: named only as a label, ``_nest``); a ``reason_*`` group
marks a known shape that is no workload gpubot may name, advise or stop.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpubot.core import text as words
from gpubot.core.runtimes import BY_KIND, RUNTIMES, runtime_of
from gpubot.core.runtimes.base import (
    OTHER,
    ROOT_SLICES,
    TAIL,
    Rank,
    Runtime,
    Shape,
    Workload,
    is_uid_owner,
    owned,
    printable_path,
    valid_user,
)

__all__ = ["OTHER", "Workload", "printable_path", "valid_user"]  # also the runtimes' names

MAX_NEST = 4  # levels of containers in containers read; deeper ones name the level reached
# v1 hierarchies to read when the v2 line says nothing (a hybrid or v1-only box), best first.
_V1_ORDER = ("name=systemd", "memory", "pids", "cpu,cpuacct", "devices", "cpuset")
_LINE = re.compile(r"(\d+):([^:\n]*):(/[^\n]*)\Z")


def ordered(runtimes: Sequence[Runtime]) -> list[tuple[str, Shape]]:
    """Return ``(kind, shape)`` of every runtime's shapes and the daemon rule (first of its
    rank: a runtime's own units hold only its daemons and shims, and stopping one would stop
    every container or job on the node), first match first. A shape with a reason is
    ``other``'s, whichever runtime gives it."""
    units = "|".join(d for r in runtimes for d in r.daemons)
    daemons = Shape(
        f"{ROOT_SLICES}(?P<reason_daemon>{units})" + TAIL, Rank.UNIT, "runtime daemon's own unit"
    )
    pairs = [(OTHER, daemons)]
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


def cgroup_paths(text: str) -> list[str] | None:
    """Return the paths of a whole ``/proc/PID/cgroup`` text, the v2 one first, then the v1
    hierarchies in ``_V1_ORDER`` and the rest; None when the text is not what the kernel writes.

    The kernel writes one ``ID:CONTROLLERS:PATH`` line per hierarchy, IDs strictly falling to
    the v2 line ``0::PATH``, which comes last. A cgroup name may hold a newline (a user may name
    a cgroup in their own subtree anything), and the kernel does not escape it: such a name
    could forge a line. Any repeated or out-of-order ID, or malformed line, makes the whole
    text untrusted.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    last: int | None = None
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            return None
        hid = int(m[1])
        if (last is not None and hid >= last) or (hid == 0) != (m[2] == ""):
            return None
        last = hid
        if hid == 0:
            v2 = m[3]
        else:
            v1[m[2]] = m[3]
    order = [v1[k] for k in _V1_ORDER if k in v1] + [p for k, p in v1.items() if k not in _V1_ORDER]
    return ([v2] if v2 is not None else []) + order


def parse_cgroup(text: str | None) -> Workload | None:
    """Return the workload a ``/proc/PID/cgroup`` text names; None when it says nothing.

    Each path is matched against the shapes; the most specific match wins (a container or job
    over a service or session over ``other``: each runtime's ``generic``; a container nested in
    another over the outer one). Text that is not the kernel's shape is ``other`` with
    ``untrusted`` in its detail: it names no owner.
    """
    if not text:
        return None
    paths = cgroup_paths(text)
    if paths is None:
        return Workload(OTHER, printable_path(text)).with_detail(untrusted="yes")
    found = [match_path(p) for p in paths if p != "/"]
    if not found:
        return None
    return min(found, key=lambda w: (runtime_of(w.kind).generic, w.get("outer") is None))


def match_path(path: str, depth: int = 0) -> Workload:
    """Return the workload one cgroup path (as ``/proc/PID/cgroup`` shows it) names."""
    for kind, pattern in SHAPES:
        m = pattern.match(path)
        if m is not None:
            g = {k: v for k, v in m.groupdict().items() if v is not None}
            why = next((r for k, r in REASONS.items() if k in g), None)
            runtime = runtime_of(kind)
            w = runtime.build(kind, path, g | ({"reason": why} if why else {}))
            tail = g.get("tail")
            if tail and runtime.nests and depth < MAX_NEST and runtime.host_id(w):
                inner = match_path(tail, depth + 1)
                if runtime_of(inner.kind).nests:
                    return _nest(w, inner)
            return w
    return Workload(OTHER, printable_path(path)).with_detail(reason="no known workload shape")


def _nest(outer: Workload, inner: Workload) -> Workload:
    """Return the workload of a container found inside ``outer``'s cgroup: docker-in-docker, a
    kind node's pods, a container run by a container's own systemd.

    The outer container's root made the inner cgroup, and chose its name: the inner id is taken
    only as a label, never looked up in the host's runtimes nor put in a stop command (it could
    be another container's). The workload's id joins both, so it is no host container's id;
    what root controls (owner, rootless uid, lookup) comes from the outer container.
    """
    inner_id = inner.get("inner_id") or runtime_of(inner.kind).host_id(inner) or inner.id
    keep = {k: v for k, v in inner.detail if k in ("pod_uid", "qos", "runtime")}
    return Workload(inner.kind, f"{outer.id}/{inner_id}").with_detail(
        **keep,
        outer=outer.id,
        outer_kind=str(outer.kind),
        inner_id=inner_id,
        uid=outer.get("uid"),
        rootless=outer.get("rootless"),
        outer_pod_uid=outer.get("pod_uid"),
    )


def decide_owner(w: Workload, uid_names: dict[int, str], owner_label: str | None) -> Workload:
    """Set ``owner`` from what root controls (each runtime's owner rule): never from a name a
    process gave itself. A name that is no well-formed user name is no owner."""
    uid = w.get("uid")
    # A rootless container's slice uid was named by the probe (``uid_name``); its processes'
    # own uids are subordinate ones that name no one.
    by_uid = w.get("uid_name") or (uid_names.get(int(uid)) if uid is not None else None)
    label = w.get(f"label.{owner_label}") if owner_label else None
    owner = runtime_of(w.kind).owner(w, by_uid, label)
    owner = owner if valid_user(owner) or is_uid_owner(owner) else None
    return w if owner == w.owner else replace(w, owner=owner)  # as it was: itself, no copy


def stop_command(w: Workload) -> str | None:
    """Return the command that stops this workload for good (a restart policy, a requeue).

    Only ids and names of a safe shape are put in a command; None when there is none to give:
    a runtime's own unit, a container inside another (the host's runtime does not know it, and
    its id was chosen inside the outer one), a runtime with no stop of its own (LXC: ``lxc stop``
    and ``lxc-stop`` are different tools, and gpubot cannot tell which one manages it).
    """
    argv = stop_argv(w)
    return " ".join(argv) if argv else None


def may_restart(w: Workload | None) -> bool:
    """Whether something may start this workload's process again once it is killed (each
    runtime's restart rule)."""
    return w is not None and runtime_of(w.kind).restarts(w)


def named(w: Workload | None) -> bool:
    """Whether ``w`` is worth naming to people: not a bare login session or unknown cgroup."""
    return w is not None and runtime_of(w.kind).named


def stop_argv(w: Workload) -> list[str] | None:
    """Return the argv that stops ``w`` for good (what ``[reset] stop_workloads`` runs), or None."""
    if w.get("outer") is not None:
        return None
    return runtime_of(w.kind).stop(w)


def short_name(w: Workload) -> str:
    """Return a short label for tables: ``docker:train-llama``, ``slurm:8812.0``."""
    return runtime_of(w.kind).short(w)


def describe(w: Workload) -> str:
    """Say what killing this workload's process kills, for plans and approvals.

    Every name is written by ``core.text.code`` (back-ticks, one line, none inside): a job
    name such as ``x` *pre-approved* `y`` stays one literal, and each front end shows it as
    one (a Slack code span, a terminal's text).
    """
    outer = w.get("outer")
    if outer is not None:
        name = w.get("outer_name") or outer[:12]
        inside = f"{w.kind} container {words.code((w.get('inner_id') or '?')[:12])}"
        return f"{inside} inside container {words.code(name)}{owned(w)}"
    return runtime_of(w.kind).describe(w)


def workload_from_dict(d: Any) -> Workload | None:
    """Rebuild a workload from ``Workload.to_dict`` output (a stored plan); None for None.

    A kind no runtime has is a ``ValueError``: a stored plan names only listed kinds.
    """
    if d is None:
        return None
    kind = d["kind"]
    if not isinstance(kind, str) or kind not in BY_KIND:
        raise ValueError(f"{kind!r} is not a workload kind")
    detail = d.get("detail") or {}
    if isinstance(detail, list):  # a plan's asdict() keeps the pairs as lists
        detail = dict(detail)
    return Workload(
        kind,
        str(d["id"]),
        d.get("name"),
        d.get("owner"),
        tuple(sorted((str(k), str(v)) for k, v in detail.items())),
    )
