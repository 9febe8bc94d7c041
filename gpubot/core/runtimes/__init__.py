"""The registry of runtimes: every module of this package that defines ``RUNTIMES``.

Each runtime lives in one module (``docker.py``, ``slurm.py`` ...; ``base.py`` says what one
gives). The registry imports every module of the package, collects their ``RUNTIMES`` in the
order each runtime names, checks them, and registers their kinds; ``core.cgroup_shapes``,
``core.workload``, ``core.enrich``, ``core.reset.stopgate`` and config validation only iterate it.
Adding a runtime is adding its module: nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections import Counter

from gpubot.core.runtimes.base import Lookup, Runtime, register

_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}")
_COMM = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # a process name as /proc/PID/status gives it


def _discover() -> tuple[Runtime, ...]:
    """Return the runtimes of every module of this package, by their ``order``."""
    found: list[Runtime] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for r in getattr(module, "RUNTIMES", ()):
            if not isinstance(r, Runtime):
                raise TypeError(f"{module.__name__}.RUNTIMES holds {r!r}, not a Runtime")
            found.append(r)
    return tuple(sorted(found, key=lambda r: r.order))


def _check(runtimes: tuple[Runtime, ...]) -> None:
    """Refuse a registry two runtimes would make ambiguous (a programming error)."""
    kinds = [r.kind for r in runtimes]
    tools = [r.lookup.tool for r in runtimes if r.lookup is not None]
    orders = [str(r.order) for r in runtimes]
    for what, values in (("kind", kinds), ("lookup tool", tools), ("order", orders)):
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


RUNTIMES: tuple[Runtime, ...] = _discover()
_check(RUNTIMES)
register(RUNTIMES)

LOOKUPS: dict[str, Lookup] = {r.lookup.tool: r.lookup for r in RUNTIMES if r.lookup is not None}
"""Each lookup by the tool name a node's settings list (``docker``, ``crictl`` ...)."""
