"""The node script that runs a workload's stop command only if everything in it is the requester's.

A stop command kills every process of the unit, container or job, not only the GPU holders
gpubot saw. So a self-service stop runs in the same exec as a check of the whole workload: every
cgroup of it and below, in each hierarchy the probe saw, and each PID's four uids. Only when
every one is the requester's does the script ``exec`` the stop. It is a constant; everything
that varies arrives as arguments, and it prints only digits and markers.

Where the check cannot see, it fails closed: a hierarchy not mounted at its root here, an
unreadable ``cgroup.procs``, a PID whose status cannot be read, an empty cgroup.

Races, and what is and is not covered:

- A PID reused before its status is read: at worst a foreign uid is seen and the stop refused.
- A process that joins between the check and the stop: a fork of a checked process (the
  requester could signal it anyway), or one moved in by something with write access to the
  root-owned cgroup (root, the runtime's daemon). Not covered: the window is the moment between
  the last read and the kill, and only root-controlled agents can add another user's process.
- ``docker stop`` ends the PID namespace; a process put into it but not into its cgroup
  (``nsenter`` by root) is not seen. ``scancel`` ends the job on every node; only this node's part
  is checked.
- A Slurm job's own ``slurmstepd`` (all four uids 0: only root can start it) is not counted.

``gate`` false (an approved forced reset, or ``--force``): the check is made and reported, then
the stop runs whatever it found.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpubot.core.names import SUDO_SH, is_linux_user
from gpubot.core.nodelog import LOGGER_SH, is_marker
from gpubot.core.runtimes import RUNTIMES
from gpubot.errors import ParseError

# $1 gate (1: refuse unless every process is $2's)  $2 uid or -  $3 1: sudo -n the stop
# $4 kind (its runtime's root helpers in it, slurm's slurmstepd, are not counted)  $5 the node's
# log line (empty: none)  $6 N, then N CONTROLLERS:PATH (v2: empty controllers), then the stop
# argv.
# Prints "unreadable I" (the I-th cgroup), "unknown PID", "foreign PID RUID EUID" (the first
# 20), "user UID NAME", "checked N foreign M", then "refused", or "logger STATUS WORDS" (the log
# line written: ``gpubot.core.nodelog``) and "stopping" and execs the stop.
STOP_SCRIPT = r"""
gate=$1; want=$2; su=$3; kind=$4; note=$5; n=$6; shift 6
set -f
mnt() {
  m=
  while read -r _ _ _ root point rest; do
    [ "$root" = / ] || continue
    case $point in *\\*) continue ;; esac
    set -- ${rest#* - }
    if [ -z "$1" ]; then continue; fi
    if [ -z "$ctl" ]; then
      [ "$1" = cgroup2 ] && { m=$point; return; }
      continue
    fi
    [ "$1" = cgroup ] || continue
    ok=1; o=",$3,"; left=$ctl,
    while [ -n "$left" ]; do
      c=${left%%,*}; left=${left#*,}
      case $o in *",$c,"*) ;; *) ok=0 ;; esac
    done
    [ "$ok" = 1 ] && { m=$point; return; }
  done </proc/self/mountinfo
}
bad=0; pids=; i=0
while [ "$i" -lt "$n" ]; do
  a=$1; shift; i=$((i + 1))
  ctl=${a%%:*}; path=${a#*:}
  mnt
  d=$m$path
  if [ -z "$m" ] || [ ! -r "$d/cgroup.procs" ]; then echo "unreadable $i"; bad=1; continue; fi
  got=$(find "$d" -type f -name cgroup.procs -exec cat -- {} + 2>/dev/null) \
    || { echo "unreadable $i"; bad=1; continue; }
  pids="$pids $got"
done
seen=' '; count=0; nf=0; uids=' '
for p in $pids; do
  case $p in *[!0-9]*) bad=1; continue ;; esac
  case $seen in *" $p "*) continue ;; esac
  seen="$seen$p "; count=$((count + 1))
  nm=; r=
  while read -r key a b c f _; do
    case $key in
      Name:) nm=$a ;;
      Uid:) r=$a; e=$b; s=$c; fs=$f; break ;;
    esac
  done 2>/dev/null <"/proc/$p/status"
  if [ -z "$r" ]; then echo "unknown $p"; bad=1; continue; fi
  if [ "$r" = "$want" ] && [ "$e" = "$want" ] && [ "$s" = "$want" ] && [ "$fs" = "$want" ]; then
    continue
  fi
  case "$kind:$nm" in
  @OWN@)
    if [ "$r" = 0 ] && [ "$e" = 0 ] && [ "$s" = 0 ] && [ "$fs" = 0 ]; then continue; fi ;;
  esac
  nf=$((nf + 1)); bad=1
  if [ "$nf" -le 20 ]; then echo "foreign $p $r $e"; fi
  for u in $r $e; do
    case $uids in *" $u "*) continue ;; esac
    uids="$uids$u "
    name=$(id -nu "$u" 2>/dev/null) && echo "user $u $name"
  done
done
echo "checked $count foreign $nf"
if [ "$gate" = 1 ] && { [ "$bad" = 1 ] || [ "$count" = 0 ]; }; then echo refused; exit 0; fi
gpubot_log "$note"
echo stopping
if [ "$su" = 1 ]; then exec @SUDO@ "$@"; fi
exec "$@"
""".replace("@SUDO@", SUDO_SH)
# Each runtime's own root helpers (``Runtime.root_helpers``) as case patterns "KIND:COMM".
STOP_SCRIPT = LOGGER_SH + STOP_SCRIPT.replace(
    "@OWN@", "|".join(f"{r.kind}:{c}" for r in RUNTIMES for c in r.root_helpers) or "-:-"
)

_CONTROLLERS = re.compile(r"[A-Za-z0-9_.=,-]*\Z")
MAX_CGROUPS = 16


def check_path(path: str) -> bool:
    """Whether ``path`` is absolute, below the root, without ``.``/``..`` or control characters."""
    parts = path.split("/")
    return (
        path.startswith("/")
        and path != "/"
        and all(p not in ("", ".", "..") for p in parts[1:])
        and all(c.isprintable() for c in path)
    )


def stop_check_argv(
    stop: Sequence[str],
    cgroups: Sequence[tuple[str, str]],
    *,
    uid: int | None,
    gate: bool,
    sudo: bool,
    kind: str,
    note: str = "",
) -> list[str]:
    """Build the argv that checks ``cgroups`` and then runs ``stop``, writing ``note`` to the
    node's log just before it (``gpubot.core.nodelog``); ``ValueError`` for anything the
    script must not be given."""
    if not stop or any("\0" in a for a in stop):
        raise ValueError("a stop command is a non-empty argv without NUL bytes")
    if "\0" in note:
        raise ValueError("a log line has no NUL byte")
    if gate and (uid is None or uid < 0):
        raise ValueError("a gated stop needs the requester's uid")
    if len(cgroups) > MAX_CGROUPS:
        raise ValueError(f"at most {MAX_CGROUPS} cgroups, not {len(cgroups)}")
    for ctl, path in cgroups:
        if not _CONTROLLERS.match(ctl) or not check_path(path):
            raise ValueError(f"not a cgroup to check: {ctl}:{path!r}")
    head = ["1" if gate else "0", "-" if uid is None else str(int(uid)), "1" if sudo else "0"]
    kind = kind if kind.isalpha() else "other"
    paths = [f"{ctl}:{path}" for ctl, path in cgroups]
    return [
        "sh",
        "-c",
        STOP_SCRIPT,
        "gpubot-stop",
        *head,
        kind,
        note,
        str(len(paths)),
        *paths,
        *stop,
    ]


@dataclass(frozen=True)
class Foreign:
    """A process in the workload that is not the requester's."""

    pid: int
    real_uid: int
    uid: int  # effective


@dataclass(frozen=True)
class StopCheck:
    """What the node said: the check's findings, and whether the stop command ran."""

    stopping: bool  # the check passed (or did not gate) and the stop command was exec'd
    refused: bool  # the check refused: nothing was stopped
    checked: int = 0  # distinct processes whose uids were read
    foreign: tuple[Foreign, ...] = ()
    foreign_count: int = 0  # all of them (only the first 20 are listed)
    unknown: tuple[int, ...] = ()  # listed pids whose status could not be read
    unreadable: tuple[int, ...] = ()  # indices (from 1) of the cgroups that could not be read
    names: tuple[tuple[int, str], ...] = ()  # uid -> user name on the node
    output: str = ""  # what the stop command itself printed
    logger: str | None = None  # the "logger STATUS WORDS" line (None: none printed)

    def name(self, uid: int) -> str | None:
        return next((n for u, n in self.names if u == uid), None)


def _digits(parts: Sequence[str], line: str) -> list[int]:
    if not all(p.isdigit() for p in parts):
        raise ParseError("stop script output", line)
    return [int(p) for p in parts]


def parse_stop_output(text: str) -> StopCheck:
    """Parse the script's answer; what follows ``stopping`` is the stop's own output. An answer
    cut short before its verdict is neither stopping nor refused."""
    lines = text.split("\n")
    foreign: list[Foreign] = []
    unknown: list[int] = []
    unreadable: list[int] = []
    names: list[tuple[int, str]] = []
    checked = count = 0
    verdict, output = "", ""
    logger: str | None = None
    for i, line in enumerate(lines):
        if line in ("refused", "stopping"):
            verdict, output = line, "\n".join(lines[i + 1 :]).strip()
            break
        if is_marker(line):
            logger = line
            continue
        key, *rest = line.split() or [""]
        if not key:
            continue
        if key == "foreign" and len(rest) == 3:
            foreign.append(Foreign(*_digits(rest, line)))
        elif key == "unknown" and len(rest) == 1:
            unknown += _digits(rest, line)
        elif key == "unreadable" and len(rest) == 1:
            unreadable += _digits(rest, line)
        elif key == "user":  # the node's passwd says it: kept only when well formed
            if len(rest) == 2 and rest[0].isdigit() and is_linux_user(rest[1]):
                names.append((int(rest[0]), rest[1]))
        elif key == "checked" and len(rest) == 3 and rest[1] == "foreign":
            checked, count = _digits([rest[0], rest[2]], line)
        else:
            raise ParseError("stop script output", line)
    return StopCheck(
        stopping=verdict == "stopping",
        refused=verdict == "refused",
        checked=checked,
        foreign=tuple(foreign),
        foreign_count=count,
        unknown=tuple(unknown),
        unreadable=tuple(unreadable),
        names=tuple(names),
        output=output,
        logger=logger,
    )
