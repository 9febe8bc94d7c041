"""Field parsing of the probe's output: ``fuser -v`` lines, ``/proc`` lines, escaped fields.

Everything a process controls about itself (name, argv, cgroup, wchan) arrives escaped and is
decoded here; anything malformed is a ``ParseError``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from gpubot.core.models import DeviceHolder, ProcInfo
from gpubot.core.workload import parse_cgroup
from gpubot.errors import ParseError

NUM = re.compile(r"[0-9]{1,12}")  # a decimal count, pid, uid or status
_ESCAPED = re.compile(r"=(?:[!-\[\]-~]|\\[0-3][0-7]{2})*")
_OCTAL = re.compile(r"\\([0-3][0-7]{2})")

# A process keeps its cgroup between probes and a job's workers share one, so a cgroup text's
# workload (frozen, from the text alone) is remembered, bounded; one past the bound is redone.
CGROUP_TEXTS = 16_384
_workload_of = functools.lru_cache(maxsize=CGROUP_TEXTS)(parse_cgroup)

_ACCESS = re.compile(r"[.cefFrmM]{5}")
_PATH_LINE = re.compile(r"(?P<path>\S.*?):(?:\s+(?P<rest>.*))?")
_FUSER_NOISE = ("Cannot stat ", "Specified filename ")


def parse_fuser(text: str) -> tuple[DeviceHolder, ...]:
    """Parse ``fuser -v`` output (stdout and stderr merged, COMMAND optional); raise ParseError."""
    holders: list[DeviceHolder] = []
    path: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith(_FUSER_NOISE):
            continue
        if line.split() == ["USER", "PID", "ACCESS", "COMMAND"]:
            continue
        if not line[0].isspace():
            m = _PATH_LINE.fullmatch(line)
            if m is None:
                raise ParseError("fuser line", raw)
            path = m["path"]
            entry = m["rest"]
            if not entry:
                continue
        else:
            entry = line.strip()
        if path is None:
            raise ParseError("fuser line (no file before it)", raw)
        parts = entry.split(None, 3)
        if len(parts) >= 2 and parts[1] == "kernel":  # a mount or swap use, not a process
            continue
        if len(parts) not in (3, 4) or not parts[1].isdigit() or not _ACCESS.fullmatch(parts[2]):
            raise ParseError("fuser line", raw)
        command = parts[3] if len(parts) == 4 else ""
        holders.append(
            DeviceHolder(
                path=path, pid=int(parts[1]), user=parts[0], access=parts[2], command=command
            )
        )
    return tuple(holders)


def parse_proc_lines(
    body: str, pids: Sequence[int], what: str = "process listing"
) -> dict[int, ProcInfo]:
    """Parse the ``procs`` section: ``c`` once, a ``p`` or ``g`` line per PID asked, ``u`` lines."""
    lines = [ln for ln in body.split("\n") if ln]
    if not lines or not lines[0].startswith("c "):
        raise ParseError(f"{what} (no clock line)", lines[0] if lines else "")
    clock = lines[0].split(" ")
    if len(clock) != 3:
        raise ParseError(f"{what} (clock line)", lines[0])
    ticks = int(clock[1]) if NUM.fullmatch(clock[1]) and int(clock[1]) > 0 else None
    uptime = float_or_none(clock[2]) if clock[2] != "-" else None
    rows: dict[int, list[str]] = {}
    seen: list[int] = []
    names: dict[int, str | None] = {}
    for line in lines[1:]:
        f = line.split(" ")
        if f[0] in ("p", "g") and not names:
            if len(f) != (12 if f[0] == "p" else 2) or not NUM.fullmatch(f[1]):
                raise ParseError(f"{what} (process line)", line[:200])
            pid = int(f[1])
            if pid in seen:
                raise ParseError(f"{what} (pid {pid} twice)", line[:200])
            seen.append(pid)
            if f[0] == "p":
                rows[pid] = f
        elif f[0] == "u" and len(f) == 3 and NUM.fullmatch(f[1]) and int(f[1]) not in names:
            names[int(f[1])] = None if f[2] == "!" else _unescape(f[2], what)
        else:
            raise ParseError(f"{what} (unexpected line)", line[:200])
    asked = list(dict.fromkeys(pids))
    if seen != asked:
        raise ParseError(f"{what} (pids not as asked)", f"{seen[:20]} for {asked[:20]}")
    uids = {int(f[6]) for f in rows.values() if NUM.fullmatch(f[6])}
    out = {pid: _proc_info(pid, f, names, ticks, uptime, what) for pid, f in rows.items()}
    # The script also names each ``user@U.service`` slice's uid (a rootless container's owner);
    # any other extra name is ignored, never an error: a user's cgroups must not fail the probe.
    if not uids <= set(names):
        raise ParseError(f"{what} (owner names)", " ".join(map(str, sorted(uids)))[:200])
    return out


def _proc_info(
    pid: int,
    f: list[str],
    names: dict[int, str | None],
    ticks: int | None,
    uptime: float | None,
    what: str,
) -> ProcInfo:
    """Build one ProcInfo from ``p PID STATE PPID START RUID EUID =COMM =CMD =EXE|! =CG =WCHAN``."""
    _, _, state, ppid, start, ruid, euid, comm, cmd, exe, cgroup, wchan = f
    if len(state) != 1 or not state.isalpha() or not all(NUM.fullmatch(x) for x in (ppid, start)):
        raise ParseError(f"{what} (process line)", " ".join(f)[:200])
    uid = int(euid) if NUM.fullmatch(euid) else None
    real = int(ruid) if NUM.fullmatch(ruid) else None
    if uid is None:
        raise ParseError(f"{what} (process line: no uid)", " ".join(f)[:200])
    elapsed = None
    if ticks and uptime is not None:
        elapsed = max(0, int(uptime - int(start) / ticks))
    name = _unescape(comm, what)
    argv = _unescape(cmd, what).rstrip("\0").split("\0")
    command = printable(" ".join(a for a in argv)).strip()
    w = _unescape(wchan, what).strip()
    cg = _unescape(cgroup, what).strip()
    work = _workload_of(cg)
    # A rootless container's user slice (root made that path): its owner's name, from passwd.
    slice_uid = work.get("uid") if work is not None and work.get("rootless") else None
    if work is not None and slice_uid is not None and NUM.fullmatch(slice_uid):
        work = work.with_detail(uid_name=names.get(int(slice_uid)))
    return ProcInfo(
        pid=pid,
        ppid=int(ppid),
        user=names.get(uid) or str(uid),
        state=state,
        start_ticks=int(start),
        elapsed_s=elapsed,
        command=command or f"[{printable(name)}]",
        wchan=None if w in ("", "0") else printable(w),
        cgroup=cg or None,
        workload=work,
        uid=uid,
        real_uid=real,
        exe=None if exe == "!" else _unescape(exe, what),
        comm=printable(name),
        argv0=argv[0],
    )


def _unescape(field: str, what: str) -> str:
    """Decode one escaped field (``=`` then printable ASCII and ``\\ooo``); raise ParseError."""
    if not _ESCAPED.fullmatch(field):
        raise ParseError(f"{what} (escaped field)", field[:200])
    if "\\" not in field:  # printable ASCII only (the usual field): nothing to decode
        return field[1:]
    raw = field[1:].replace("\\000", "\0")  # argv's separators, most escapes: at once
    if "\\" in raw:
        raw = _OCTAL.sub(lambda m: chr(int(m[1], 8)), raw)
    return raw.encode("latin-1").decode("utf-8", errors="replace")


def printable(text: str) -> str:
    """Return ``text`` with every non-printable character (newline, tab, bidi ...) as ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def float_or_none(s: str | None) -> float | None:
    """Return ``s`` as a float; None when it is empty or not a number."""
    try:
        return float(s) if s else None
    except ValueError:
        return None
