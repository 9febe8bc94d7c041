"""``gpubot doctor``'s descriptor line: the ``RLIMIT_NOFILE`` against the fleet's size.

gpubot keeps one descriptor per node's connection and raises the soft limit to the hard one at
start, so the hard limit decides: below the fleet's size, idle connections are closed and
reopened and every sweep is slower. It reads its own process's limits (under systemd, the
unit's ``LimitNOFILE`` is what ``serve`` gets).
"""

from __future__ import annotations

from gpubot.core import fdbudget
from gpubot.core.doctor.checks import Check, failed, passed

AREA = "limits"
NAME = "descriptors for the fleet"


def descriptor_check(nodes: int, soft: int, hard: int | None) -> Check:
    """Check that the limit gpubot will run under (``hard`` None: unlimited) keeps one SSH
    connection per node."""
    at_start = fdbudget.raised_to(soft, hard)
    cap = fdbudget.connection_cap(at_start)
    limits = f"soft {soft}, hard {'unlimited' if hard is None else hard}"
    if at_start > soft:
        limits += f" (raised to {at_start} at start)"
    room = f"{limits}: {cap} SSH connections for {nodes} node{'s' if nodes != 1 else ''}"
    if nodes <= cap:
        return passed(AREA, NAME, room)
    want = fdbudget.needed(nodes)
    fix = (
        f"raise the hard limit to at least {want}: LimitNOFILE={want} in the systemd unit, "
        f"`ulimit -Hn {want}` (or limits.conf) for a shell, --ulimit nofile={want} for docker"
    )
    return failed(AREA, NAME, f"{room}: idle connections are closed and reopened (slower)", fix)
