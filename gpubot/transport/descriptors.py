"""The process's descriptor limit: raised at start, read for the SSH pool's cap.

The arithmetic is ``core.fdbudget``'s; this module reads and sets ``RLIMIT_NOFILE`` and logs.
"""

from __future__ import annotations

import logging
import resource

from gpubot.core import fdbudget

log = logging.getLogger("gpubot.transport.descriptors")


def limits() -> tuple[int, int | None]:
    """Return this process's soft and hard ``RLIMIT_NOFILE`` (hard None: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (fdbudget.UNLIMITED_TARGET if soft == inf else soft), (None if hard == inf else hard)


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one, as servers do; return (before, after).
    One the kernel refuses (``fs.nr_open``) is left as it was, and the logged line says so."""
    before, hard = limits()
    target = fdbudget.raised_to(before, hard)
    if target > before:
        try:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (target, resource.RLIM_INFINITY if hard is None else hard)
            )
        except (ValueError, OSError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            log.warning("descriptor limit: cannot raise soft %d to %d: %s", before, target, why)
    after, hard = limits()
    log.info("%s", fdbudget.raised_line(before, after, hard))
    return before, after


def connection_cap() -> int:
    """Return how many SSH connections the current soft limit allows, with headroom."""
    return fdbudget.connection_cap(limits()[0])


def check_fleet(nodes: int) -> str | None:
    """Log (a warning) and return the line saying the fleet is larger than the limit allows."""
    line = fdbudget.fleet_line(nodes, limits()[0])
    if line is not None:
        log.warning("%s", line)
    return line
