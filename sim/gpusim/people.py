"""The fleet's own people: named accounts that exist only inside the simulated fleet.

``SimFleet(people=("dana", "alice", "bob"))`` (root only: a workload then runs as another uid)
gives each name a uid that no account of this host has (from ``FIRST_UID`` up) and puts two
stand-ins first on every session's PATH: ``getent`` answers ``getent passwd`` for those uids and
names from the fleet's table and asks the host's own for the rest; ``id -nu UID`` likewise.
gpubot's probe reads ``/etc/passwd`` for local accounts and asks ``getent`` only for the uids it
does not hold there (as for LDAP or SSSD users), so these people appear under their names on
the simulated nodes, and no account is added to the host. ``SimNode.spawn(user="alice")`` runs
the workload as alice's uid. Nodes that run commands through the sudo stand-in look programs
up in sudo's ``secure_path`` and see the uids unnamed.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpusim.errors import SimUsageError

FIRST_UID = 61000
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
NOLOGIN = "/usr/sbin/nologin"

Accounts = Mapping[str, pwd.struct_passwd]


def _taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def accounts(names: Sequence[str]) -> dict[str, pwd.struct_passwd]:
    """Return an account for each name, on uids (and like-numbered gids) the host lacks;
    ``SimUsageError`` for a bad or host-held name, a repeat, or without root."""
    if not names:
        return {}
    if os.geteuid() != 0:
        raise SimUsageError("people: running workloads as other uids needs root")
    out: dict[str, pwd.struct_passwd] = {}
    uid = FIRST_UID
    for name in names:
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in out:
            raise SimUsageError(f"people: bad or repeated user name {name!r}")
        try:
            pwd.getpwnam(name)
        except KeyError:
            pass
        else:
            raise SimUsageError(f"people: {name!r} is an account of this host already")
        while _taken(uid):
            uid += 1
        out[name] = pwd.struct_passwd((name, "x", uid, uid, name, "/", NOLOGIN))
        uid += 1
    return out


def _entry(pw: pwd.struct_passwd) -> str:
    return f"{pw.pw_name}:x:{pw.pw_uid}:{pw.pw_gid}:{pw.pw_gecos}:{pw.pw_dir}:{pw.pw_shell}"


def _table(var: str, pairs: Mapping[str, str]) -> str:
    items = " ".join(f"[{k}]='{v}'" for k, v in pairs.items())
    return f"declare -A {var}=({items})"


GETENT = """#!/bin/bash
# gpusim: getent passwd answers the fleet's people first, then the host's getent.
real={real}
{by_key}
if [[ $1 == passwd ]]; then
  shift
  if (($# == 0)); then
    [[ -x $real ]] && "$real" passwd
    printf '%s\\n' "${{E[@]}}"
    exit 0
  fi
  rc=0 rest=()
  for k in "$@"; do
    if [[ -n ${{E[$k]+x}} ]]; then echo "${{E[$k]}}"; else rest+=("$k"); fi
  done
  if ((${{#rest[@]}})); then
    if [[ -x $real ]]; then "$real" passwd "${{rest[@]}}" || rc=$?; else rc=2; fi
  fi
  exit $rc
fi
[[ -x $real ]] || exit 1
exec "$real" "$@"
"""

ID = """#!/bin/bash
# gpusim: id -nu answers the fleet's people first, then the host's id.
real={real}
{by_key}
if (($# == 2)) && [[ $1 == -nu || $1 == -un ]] && [[ -n ${{N[$2]+x}} ]]; then
  echo "${{N[$2]}}"
  exit 0
fi
exec "$real" "$@"
"""


def write_standins(folder: Path, people: Accounts) -> Path:
    """Write the ``getent`` and ``id`` stand-ins for ``people`` into ``folder``; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    names = {}
    for pw in people.values():
        for key in (str(pw.pw_uid), pw.pw_name):
            entries[key] = _entry(pw)
            names[key] = pw.pw_name
    for prog, text, var, pairs in (("getent", GETENT, "E", entries), ("id", ID, "N", names)):
        real = shutil.which(prog, path="/usr/bin:/bin:/usr/sbin:/sbin") or f"/usr/bin/{prog}"
        path = folder / prog
        path.write_text(text.format(real=real, by_key=_table(var, pairs)))
        path.chmod(0o755)
    return folder
