"""The runtimes gpubot knows, in one list: ``RUNTIMES``.

Each runtime is one ``Runtime`` value in its own module (``docker.py``, ``slurm.py`` ...;
``base.py`` says what one gives). Within a rank their shapes are tried in this list's order.
Adding a runtime is writing its module, naming its value here, and its test: everything else
(``core.workload``, ``core.enrich``, ``reset.stopgate``, ``doctor.sudo``,
config validation) iterates this list.
"""

from __future__ import annotations

import re
from collections import Counter

from gpubot.core.runtimes import docker, kubernetes, lxc, machined, other, podman, slurm, systemd
from gpubot.core.runtimes.base import Lookup, Runtime

RUNTIMES: tuple[Runtime, ...] = (
    docker.RUNTIME,
    podman.RUNTIME,
    slurm.RUNTIME,
    kubernetes.RUNTIME,
    lxc.RUNTIME,
    machined.RUNTIME,
    systemd.SERVICE,
    systemd.SESSION,
    other.RUNTIME,  # what no runtime names: last
)

_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}")
_COMM = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # a process name as /proc/PID/status gives it


def _check(runtimes: tuple[Runtime, ...]) -> None:
    """Refuse a list two runtimes would make ambiguous (a programming error)."""
    kinds = [r.kind for r in runtimes]
    tools = [r.lookup.tool for r in runtimes if r.lookup is not None]
    for what, values in (("kind", kinds), ("lookup tool", tools)):
        twice = sorted(v for v, n in Counter(values).items() if n > 1)
        if twice:
            raise ValueError(f"runtimes: {what} given twice: {', '.join(twice)}")
    for r in runtimes:
        if not _KIND.fullmatch(r.kind):
            raise ValueError(f"runtimes: kind {r.kind!r} is not a short lowercase name")
        if not all(_COMM.fullmatch(c) for c in r.root_helpers):
            raise ValueError(f"{r.kind}: a root helper is not a process name: {r.root_helpers}")
        for s in r.shapes:
            groups = [g for g in re.compile(s.pattern).groupindex if g.startswith("reason_")]
            if bool(groups) != (s.reason is not None):
                raise ValueError(f"{r.kind}: a shape with a reason needs a reason_ group: {s}")


_check(RUNTIMES)

BY_KIND: dict[str, Runtime] = {r.kind: r for r in RUNTIMES}
LOOKUPS: dict[str, Lookup] = {r.lookup.tool: r.lookup for r in RUNTIMES if r.lookup is not None}
"""Each lookup by the tool name a node's settings list (``docker``, ``crictl`` ...)."""


def runtime_of(kind: str) -> Runtime:
    """Return the runtime of a listed kind (KeyError for any other)."""
    return BY_KIND[kind]


def find_runtime(kind: str | None) -> Runtime | None:
    """Return the runtime of ``kind``, or None when it names none (text from a stored record)."""
    return BY_KIND.get(kind) if kind is not None else None
