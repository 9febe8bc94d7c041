"""Slurm: a job's steps, in the cgroups slurmstepd makes for them.

Cgroup shapes (slurm.conf/cgroup.conf, ``src/plugins/cgroup/v1/xcgroup.c``): v1
``/slurm/uid_U/job_J/step_S``, or ``/slurm_NODE/...`` under ``MULTIPLE_SLURMD`` (Debian's and
Spack's builds); v2 ``/system.slice/NODE_slurmstepd.scope/job_J/step_S``, and from Slurm 26.05
``.../slurmstepd.scope/SLUID/step_S`` (doc/html/cgroups.shtml). slurmstepd's own scope
(``.../slurmstepd.scope/system``) holds only its daemons.

Lookup: ``scontrol show job ID`` (SchedMD/slurm ``src/scontrol/info_job.c`` ``_sprint_job_info``):
``JobId=N [ArrayJobId=.. ArrayTaskId=.. [ArrayTaskThrottle=..] | HetJobId=.. HetJobOffset=..]
JobName=<rest of line>``, an optional ``   HetJobIdSet=`` line, then
``   UserId=NAME(UID) GroupId=NAME(GID) MCS_label=..``; records end with a blank line. An
unknown uid prints as ``nobody(UID)`` (``src/common/uid.c``). One id may print several
records (every task of an array, every component of a heterogeneous job). scontrol does not
escape what a job's owner wrote (its name, comment, paths), so each job's output is framed by
markers the script prints and checked for forgery: any doubt drops the record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpubot.core import text
from gpubot.core.runtimes import inspect_json
from gpubot.core.runtimes.base import (
    TAIL,
    Found,
    Lookup,
    Runtime,
    Shape,
    Workload,
    always,
    own_id,
    valid_user,
)

# Slurm 26.05+ names a job's v2 cgroup by its SLUID ("s" and 13 Crockford base32 digits,
# src/common/sluid.h; commit de2b2dd9 "cgroup/v2 - Use sluid instead of job_id in cgroup path").
SLUID = r"s[0-9A-HJKMNP-TV-Z]{13}"
_SLUID = re.compile(SLUID)
_JOB_ID = re.compile(r"[0-9]{1,10}")

# The markers frame each job's output: a job's owner can add marker lines (in a job name) but not
# remove the script's own, so any forged one makes the sequence differ and drops everything.
# Each job's output is printed only once scontrol has finished, so a hang prints nothing of it.
SLURM_SCRIPT = r"""for j do
  o=$(scontrol show job "$j")
  printf '\n@gpubot-job %s\n%s\n' "$j" "$o"
done
printf '\n@gpubot-end\n'"""

_MARK = re.compile(r"@gpubot-(?:job ([0-9]{1,10})|end)")
_FIRST = re.compile(
    r"JobId=([0-9]{1,10}) (?:ArrayJobId=[0-9]+ ArrayTaskId=\S+ (?:ArrayTaskThrottle=[0-9]+ )?"
    r"|HetJobId=[0-9]+ HetJobOffset=[0-9]+ )?JobName=(.*)"
)
_USER_TOKEN = re.compile(r"(?:^|\s)UserId=")
_USER_LINE = re.compile(r"   UserId=([^\s()]{1,64})\(([0-9]{1,10})\) GroupId=")
_STATE_LINE = re.compile(r"   JobState=([A-Z_]{1,32})(?: |\Z)")
_NOBODY_UID = 65534


def parse_scontrol(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Read the output of the ``slurm`` argv: a record for each asked job that is beyond doubt.

    The script's markers must come exactly as written (one per job in order, then the end), or
    nothing is trusted. In a job's part every record must carry exactly one ``UserId=`` (a
    second, or a token on another line, is forged text), all records there must name the same
    user (an array's tasks and a heterogeneous job's components share one), and the job itself
    must appear exactly once. A job gone from Slurm prints nothing and is simply absent.
    """
    asked = list(dict.fromkeys(i for i in ids if isinstance(i, str) and _JOB_ID.fullmatch(i)))
    parts = _segments(stdout, asked)
    if parts is None:
        return {}
    out: dict[str, Found] = {}
    for job, lines in parts.items():
        found = _segment(job, lines)
        if found is not None:
            out[job] = found
    return out


def _segments(stdout: str, asked: list[str]) -> dict[str, list[str]] | None:
    """Split the output at the script's markers; None unless they are exactly the expected."""
    got: list[str | None] = []
    parts: list[list[str]] = []
    for line in stdout.split("\n"):
        m = _MARK.fullmatch(line)
        if m is not None:
            got.append(m[1])
            parts.append([])
        elif parts:
            parts[-1].append(line)
    if got != [*asked, None]:
        return None
    return dict(zip(asked, parts, strict=False))


def _segment(job: str, lines: list[str]) -> Found | None:
    """Return ``job``'s record from its part of the output, or None when in any doubt."""
    starts = [n for n, line in enumerate(lines) if line.startswith("JobId=")]
    records = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=False)]
    parsed = [_record(r) for r in records]
    jobs = [p for p in parsed if p is not None]
    if not jobs or len(jobs) != len(parsed) or len({(u, f.uid) for _, u, f in jobs}) != 1:
        return None
    mine = [f for j, _, f in jobs if j == job]
    return mine[0] if len(mine) == 1 else None


def _record(lines: list[str]) -> tuple[str, str, Found] | None:
    """Parse one record (its ``JobId=`` line and the lines up to the next) into its job id, the
    user as scontrol printed it, and the record; None if malformed."""
    first = _FIRST.fullmatch(lines[0])
    if first is None or sum(len(_USER_TOKEN.findall(line)) for line in lines) != 1:
        return None
    users = [m for m in map(_USER_LINE.match, lines[1:]) if m is not None]
    if len(users) != 1:
        return None
    user, uid = users[0][1], int(users[0][2])
    states = [m[1] for m in map(_STATE_LINE.match, lines[1:]) if m is not None]
    named = user if valid_user(user) and (user != "nobody" or uid == _NOBODY_UID) else None
    state = states[0] if len(states) == 1 else None
    return first[1], user, Found(name=inspect_json.text(first[2]), user=named, uid=uid, state=state)


def _argv(ids: Sequence[str], sudo: Sequence[str]) -> list[str]:
    return ["sh", "-c", SLURM_SCRIPT, "gpubot-scontrol", *ids]  # scontrol needs no root


def _apply(w: Workload, found: Found, owner_label: str | None) -> Workload:
    uid = str(found.uid) if found.uid is not None else None
    return replace(w, name=found.name or w.name).with_detail(
        user=found.user, uid=uid, state=found.state
    )


def _contradicts(w: Workload, found: Found) -> bool:
    uid = w.get("uid")
    return uid is not None and found.uid is not None and uid != str(found.uid)


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    job = g.get("job") or g["sluid"]
    return Workload(kind, job).with_detail(step=g.get("step"), uid=g.get("uid"))


def _describe(w: Workload) -> str:
    step = w.get("step")
    bits = [
        f"user {text.code(w.owner)}" if w.owner else None,
        f"job name {text.code(w.name)}" if w.name else None,
    ]
    said = ", ".join(b for b in bits if b)
    return (
        f"Slurm job {w.id}"  # digits and [a-z0-9]+ only (the cgroup shapes)
        + (f" step {step}" if step else "")
        + (f" ({said})" if said else "")
    )


def _short(w: Workload) -> str:
    step = w.get("step")
    return f"slurm:{w.id}" + (f".{step}" if step is not None else "")


def _owner(w: Workload, by_uid: str | None, label: str | None) -> str | None:
    return by_uid or w.get("user")  # the uid_U of a v1 path, or the user scontrol gave


def _stop(w: Workload) -> list[str] | None:
    ok = w.id.isdigit() or _SLUID.fullmatch(w.id)
    return ["scancel", w.id] if ok else None  # a SLUID too (Slurm 26.05, src/scancel/opt.c)


def _is_root(w: Workload, comp: str, prev: str) -> bool:
    # The whole job: scancel ends every step. Slurm 26.05's v2 cgroup is named by the job's
    # SLUID itself, without "job_".
    return comp == f"job_{w.id}" or (comp == w.id and _SLUID.fullmatch(w.id) is not None)


RUNTIME = Runtime(
    kind="slurm",
    shapes=(
        Shape(
            r"/slurm(?:_[A-Za-z0-9._-]+)?/uid_(?P<uid>\d+)/job_(?P<job>\d+)"
            r"(?:/step_(?P<step>[a-z0-9]+))?" + TAIL
        ),
        Shape(
            r"/system\.slice/(?:[^/]+_)?slurmstepd\.scope/(?:job_(?P<job>\d+)|(?P<sluid>"
            + SLUID
            + r"))(?:/step_(?P<step>[a-z0-9]+))?"
            + TAIL
        ),
    ),
    daemons=(
        r"slurmd\.service",
        r"slurmctld\.service",
        r"slurmdbd\.service",
        r"(?:[^/]+_)?slurmstepd\.scope",
    ),
    build=_build,
    describe=_describe,
    short=_short,
    owner=_owner,
    stop=_stop,
    stop_note="ends the job on every node it runs on, not only on this one",
    sudo_stop="scancel *",
    restarts=always,  # its batch script may start the next step
    root_helpers=("slurmstepd",),  # in each job's own cgroup, as root
    is_root=_is_root,
    noun="Slurm job {}",
    lookup=Lookup(
        tool="slurm",
        ids=_JOB_ID,
        argv=_argv,
        parse=parse_scontrol,
        target=own_id,  # scontrol is asked by numeric job id only (the lookup's ids)
        apply=_apply,
        contradicts=_contradicts,
    ),
)

KIND = RUNTIME.kind  # the scheduler's name too (``scheduler = "slurm"``, ``[slurm]``)


def job_of(w: Workload | None) -> str | None:
    """Return the Slurm job ``w`` runs in (its cgroup's job id); None: in none."""
    return w.id if w is not None and w.kind == KIND else None
