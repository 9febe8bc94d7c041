"""GPU-hours by allocation, from Slurm's accounting: the ``sacct`` to run on a node, its parse,
and the hours each user was allocated inside a report's window (pure functions, no I/O).

The text form, not ``--json``: ``-X`` gives one row per allocation (``--json`` on 22.05 prints
openapi/dbv0.0.38 records with each job's name, comment, working directory and steps, whose
shape changes with each plugin version), and only fields whose values Slurm or the site chose
are asked for, never the job's name or comment that its owner typed. ``-P`` joins them with
``|``; a row whose field count is not the asked one (a ``|`` inside an account or user name)
is skipped and counted, never read shifted. Times are asked as unix seconds
(``SLURM_TIME_FORMAT=%s``); ISO times, read as UTC (``TZ=UTC``), are taken as well, where a
wrapper drops the variable. ``-S``/``-E`` are UTC ``YYYY-MM-DDTHH:MM:SS`` under ``TZ=UTC``: the
form 22.05's ``parse_time`` takes. Recorded real output: ``tests/corpus/slurm/sacct-*.txt``.

GPUs are ``gres/gpu=N`` of ``AllocTRES`` (``AccountingStorageTRES=gres/gpu``); where only typed
counts are kept (``gres/gpu:a100=N``), their sum. A job on several nodes counts, on the nodes
gpubot watches, its GPUs in proportion to its nodes there (Slurm's ``--gres`` is per node).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpubot.core import text
from gpubot.core.slurm.parse import MAX_TIME, SlurmParseError, expand_hostlist

FIELDS = ("JobID", "User", "Account", "AllocTRES", "Start", "End", "State", "NodeList")
UNSET = frozenset({"Unknown", "None", ""})  # ``slurm_make_time_str`` of 0 or INFINITE
MOST_GPUS = 1 << 20  # a count beyond this is not a GPU count

_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,6})?")
_NAME = re.compile(r"[^\s|]{1,256}")
_STATE = re.compile(r"([A-Z][A-Z_]{0,31})(?: by [0-9]{1,10})?")
_TRES = re.compile(r"gres/gpu(?::([^=,\s]{1,64}))?=([0-9]{1,9})")
_EPOCH = re.compile(r"[0-9]{1,12}")
_ISO = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")


@dataclass(frozen=True)
class Allocation:
    """One job's GPUs on the watched nodes, from its start to its end (None: still running)."""

    job_id: str
    user: str
    account: str
    gpus: float  # GPUs on the watched nodes: a share of a multi-node job's
    start: float
    end: float | None
    state: str


@dataclass(frozen=True)
class SacctRead:
    """What one ``sacct`` said: the allocations of GPUs, the rows read, and the rows skipped."""

    jobs: tuple[Allocation, ...]
    rows: int  # rows read (jobs of any kind, started or not)
    skipped: int  # rows that did not read (wrong field count, a bad value)


def utc_text(t: float) -> str:
    """Return ``t`` as sacct's ``-S``/``-E`` take it under ``TZ=UTC``."""
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%S")


def sacct_argv(since: float, until: float, nodes: Sequence[str], timeout_s: float) -> list[str]:
    """Return the argv that lists the allocations overlapping [since, until] on ``nodes``
    (Slurm's NodeNames; empty: the whole cluster), every user's, cut after ``timeout_s``."""
    t = f"{timeout_s:.3f}".rstrip("0").rstrip(".")
    argv = ["timeout", "-k", "1", t, "env", "TZ=UTC", "SLURM_TIME_FORMAT=%s", "sacct"]
    argv += ["-X", "-a", "-n", "-P", "--noconvert", "-S", utc_text(since), "-E", utc_text(until)]
    if nodes:
        argv += ["-N", ",".join(nodes)]
    return [*argv, "--format=" + ",".join(FIELDS)]


def _time(value: str) -> float | None:
    """Return a time of sacct's (unix seconds, or ISO read as UTC); None: unset. Raises
    ``ValueError`` for anything else."""
    if value in UNSET:
        return None
    if _EPOCH.fullmatch(value):
        t = float(value)
    elif _ISO.fullmatch(value):
        t = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    else:
        raise ValueError(f"bad time {text.cut(value, 40)!r}")
    if t <= 0 or t > MAX_TIME:
        return None
    return t


def gpus_of(tres: str) -> int:
    """Return the GPUs of an ``AllocTRES`` (``billing=1,cpu=1,gres/gpu=2,node=1``): the untyped
    count, else the typed counts' sum, else 0. Raises ``ValueError`` for a malformed list."""
    untyped: int | None = None
    typed = 0
    for item in tres.split(",") if tres else ():
        if "=" not in item:
            raise ValueError(f"bad TRES {text.cut(item, 40)!r}")
        m = _TRES.fullmatch(item)
        if m is None:
            if item.startswith(("gres/gpu=", "gres/gpu:")):
                raise ValueError(f"bad GPU count {text.cut(item, 40)!r}")
            continue
        n = int(m[2])
        if m[1] is None:
            untyped = n
        else:
            typed += n
    count = untyped if untyped is not None else typed
    if count > MOST_GPUS:
        raise ValueError(f"{count} GPUs")
    return count


def _row(cells: list[str], watched: Collection[str] | None) -> Allocation | None:
    """Return the allocation of one row's cells (None: no GPU, or not started); raises
    ``ValueError`` (or ``SlurmParseError``) for a row that does not read."""
    job, user, account, tres, start_s, end_s, state_s, nodelist = cells
    if not _JOB_ID.fullmatch(job) or not (_NAME.fullmatch(user) and user.isprintable()):
        raise ValueError("bad job id or user")
    if account and not (_NAME.fullmatch(account) and account.isprintable()):
        raise ValueError("bad account")
    state = _STATE.fullmatch(state_s)
    if state is None:
        raise ValueError("bad state")
    gpus = float(gpus_of(tres))
    start, end = _time(start_s), _time(end_s)
    if start is None or gpus == 0:
        return None  # pending, or no GPU: no GPU-hours
    if end is not None and end < start:
        raise ValueError("ends before it starts")
    hosts = [] if nodelist in UNSET else expand_hostlist(nodelist)
    if watched is not None and hosts:
        gpus *= sum(1 for h in hosts if h in watched) / len(hosts)
    if gpus == 0:
        return None
    return Allocation(job, user, account, gpus, start, end, state[1])


def parse_sacct(stdout: str, watched: Collection[str] | None = None) -> SacctRead:
    """Return the GPU allocations of ``sacct_argv``'s output; ``watched``: Slurm's names of the
    nodes gpubot counts (None: all of a job's nodes). A row that does not read is skipped and
    counted, never guessed."""
    jobs: list[Allocation] = []
    rows = skipped = 0
    for line in stdout.splitlines():
        if not line.strip():
            continue
        rows += 1
        cells = line.split("|")
        if len(cells) != len(FIELDS):
            skipped += 1
            continue
        try:
            alloc = _row(cells, watched)
        except (ValueError, SlurmParseError):
            skipped += 1
            continue
        if alloc is not None:
            jobs.append(alloc)
    return SacctRead(tuple(jobs), rows, skipped)


def allocated_ms(
    jobs: Iterable[Allocation], since: float, until: float, now: float
) -> dict[str, int]:
    """Return each user's allocated GPU-milliseconds inside [since, until): a job that started
    before ``since`` counts its part inside; one still running counts up to ``until`` or
    ``now``, whichever is first."""
    acc: dict[str, float] = {}
    for j in jobs:
        lo = max(j.start, since)
        hi = min(now if j.end is None else j.end, until)
        if hi > lo:
            acc[j.user] = acc.get(j.user, 0.0) + (hi - lo) * j.gpus
    return {u: round(s * 1000) for u, s in acc.items()}
