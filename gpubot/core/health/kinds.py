"""Every kind of finding a sweep raises, in one list: ``KINDS``.

Each kind is one ``FindingKind`` value (its stored name, its title, what its alert offers),
declared next to the check that raises it. Adding a check is writing its module, naming its
kinds here, and its test: alerting, the alerts' words and buttons, and the metrics read only
this list. A kind's stored name is in the database and in alert keys: it never changes.
"""

from __future__ import annotations

import json
from collections import Counter

from gpubot.core import findings
from gpubot.core.claims import rules as claims
from gpubot.core.findings import FindingKey, FindingKind
from gpubot.core.health import findings as health
from gpubot.core.health import hung, vanished, xid
from gpubot.core.slurm import findings as slurm
from gpubot.errors import UsageError

KINDS: tuple[FindingKind, ...] = (
    findings.ORPHANED_VRAM,
    findings.ZOMBIE_PROCESS,
    findings.HIDDEN_HOLDER,
    findings.IDLE_HOLDER,
    findings.NODE_UNREACHABLE,
    findings.NODE_SLOW,
    findings.SMI_FAILED,
    findings.GPU_LOST,
    health.MEMORY_REPAIR_PENDING,
    health.REMAP_FAILED,
    health.ECC_UNCORRECTED,
    health.FABRIC_NOT_READY,
    health.NVLINK_DOWN,
    health.GPU_THROTTLED,
    xid.GPU_XID,
    xid.NVSWITCH_SXID,
    claims.CLAIM_INTRUDER,
    slurm.ALLOCATED_UNUSED,
    slurm.OUTSIDE_SLURM,
    slurm.NODE_DRAINED,
    health.ECC_SINCE_LOAD,
    vanished.GPU_VANISHED,
    hung.HUNG_BUSY,
)


def _check(kinds: tuple[FindingKind, ...]) -> None:
    """Refuse two kinds under one stored name (they would share their alerts)."""
    twice = sorted(v for v, n in Counter(k.value for k in kinds).items() if n > 1)
    if twice:
        raise ValueError(f"finding kinds: name given twice: {', '.join(twice)}")


_check(KINDS)

BY_NAME: dict[str, FindingKind] = {k.value: k for k in KINDS}


def title_of(name: str) -> str:
    """Return the title of a stored kind name (the name itself for one no longer listed)."""
    kind = BY_NAME.get(name)
    return kind.heading if kind is not None else name


def parse_key(text: str) -> FindingKey:
    """Parse ``FindingKey.text()`` back (a button's value, a stored row); raise ``UsageError``
    for anything else, a kind no check raises included."""
    try:
        node, gpu, kind, holder = json.loads(text)
        key = FindingKey(str(node), None if gpu == "-" else int(gpu), str(kind), str(holder))
    except (ValueError, TypeError):
        raise UsageError(f"not a finding key: {text[:80]!r}") from None
    if key.kind not in BY_NAME:
        raise UsageError(f"not a finding kind: {key.kind!r}")
    return key
