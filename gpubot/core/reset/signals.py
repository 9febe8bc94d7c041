"""Remote scripts of the reset engine: signal a process only if it is still the same process.

Identity is checked on the node, in the same exec, just before each ``kill``: the kernel start
time and the effective uid must be the planned ones, so a reused PID or a process whose owner
changed is never signalled. The script is constant; identities arrive as validated arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpubot.core.names import SUDO_SH
from gpubot.core.nodelog import LOGGER_SH, is_marker
from gpubot.errors import ParseError

# $1: TERM | KILL | check   $2: 1 to use `sudo -n kill`   $3: the node's log line (empty: none)
# then PID:START_TICKS:UID triples.
# Prints one line per triple: "PID gone" | "PID reused" | "PID owner UID" | "PID alive STATE WCHAN"
# | "PID sent" | "PID failed"; then, with a log line, "logger STATUS WORDS"
# (``gpubot.core.nodelog``: written after the signals, so logger never delays or stops one).
SIGNAL_SCRIPT = r"""
sig=$1; su=$2; note=$3; shift 3
k() { if [ "$su" = 1 ]; then @SUDO@ kill "$@"; else kill "$@"; fi; }
for t; do
  p=${t%%:*}; rest=${t#*:}; want=${rest%%:*}; wuid=${rest#*:}
  s=$(cat "/proc/$p/stat" 2>/dev/null) || { echo "$p gone"; continue; }
  r=${s##*) }
  set -- $r
  st=$1; shift 19; ticks=$1
  if [ "$ticks" != "$want" ]; then echo "$p reused"; continue; fi
  if [ "$st" = Z ] || [ "$st" = X ]; then echo "$p gone"; continue; fi
  u=
  while read -r key _ eu _; do
    if [ "$key" = Uid: ]; then u=$eu; break; fi
  done 2>/dev/null <"/proc/$p/status"
  [ -n "$u" ] || { echo "$p gone"; continue; }
  if [ "$u" != "$wuid" ]; then echo "$p owner $u"; continue; fi
  if [ "$sig" = check ]; then
    w=$(cat "/proc/$p/wchan" 2>/dev/null); echo "$p alive $st ${w:-0}"; continue
  fi
  if k -s "$sig" "$p" 2>/dev/null; then echo "$p sent"; else echo "$p failed"; fi
done
[ "$sig" = check ] || gpubot_log "$note"
""".replace("@SUDO@", SUDO_SH)
SIGNAL_SCRIPT = LOGGER_SH + SIGNAL_SCRIPT

SIGNALS = ("TERM", "KILL", "check")
Identity = tuple[int, int, int]  # (pid, start_ticks, uid)


class PidStatus(StrEnum):
    """What the signal script said of one planned process (a ``signal`` step's ``result``)."""

    GONE = "gone"
    REUSED = "reused"  # another process has its pid now
    OWNER = "owner"  # its owner is not the planned one
    ALIVE = "alive"  # ("check") still there
    SENT = "sent"
    FAILED = "failed"  # kill failed on the node
    NOT_SENT = "not-sent"  # not from the node: the plan lacks its identity, nothing was sent


@dataclass(frozen=True)
class PidReport:
    """What the node said about one planned process."""

    pid: int
    status: PidStatus
    state: str | None = None
    wchan: str | None = None
    uid: int | None = None  # with OWNER: the uid the process has now

    @property
    def why(self) -> str | None:
        """Say why a planned process was not signalled, if it was not."""
        if self.status == PidStatus.REUSED:
            return "its start time differs from the plan's: the pid was reused; not signalled"
        if self.status == PidStatus.OWNER:
            return f"its owner is now uid {self.uid}, not the planned owner; not signalled"
        if self.status == PidStatus.FAILED:
            return "kill failed on the node"
        return None


def signal_argv(
    signal: str, targets: Sequence[Identity], *, sudo: bool, note: str = ""
) -> list[str]:
    """Build the argv that signals (or checks) ``(pid, start_ticks, uid)``, identity first;
    ``note``: the line written to the node's log after the signals (``gpubot.core.nodelog``)."""
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}")
    if "\0" in note:
        raise ValueError("a log line has no NUL byte")
    pairs = [
        f"{int(pid)}:{int(ticks)}:{int(uid)}"
        for pid, ticks, uid in targets
        if pid > 0 and ticks >= 0 and uid >= 0
    ]
    su = "1" if sudo else "0"
    return ["sh", "-c", SIGNAL_SCRIPT, "gpubot-signal", signal, su, note, *pairs]


_BARE = frozenset({PidStatus.GONE, PidStatus.REUSED, PidStatus.SENT, PidStatus.FAILED})


def parse_signal_output(text: str) -> dict[int, PidReport]:
    """Parse the script's lines into one report per PID (the logger marker is not one:
    ``nodelog.find_marker`` reads it)."""
    out: dict[int, PidReport] = {}
    for line in text.splitlines():
        if not line.strip() or is_marker(line):
            continue
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            raise ParseError("signal script output", line)
        pid, said = int(parts[0]), parts[1]
        if said == PidStatus.ALIVE and len(parts) == 4:
            wchan = None if parts[3] == "0" else parts[3]
            out[pid] = PidReport(pid, PidStatus.ALIVE, parts[2], wchan)
        elif said == PidStatus.OWNER and len(parts) == 3 and parts[2].isdigit():
            out[pid] = PidReport(pid, PidStatus.OWNER, uid=int(parts[2]))
        elif said in _BARE and len(parts) == 2:
            out[pid] = PidReport(pid, PidStatus(said))
        else:
            raise ParseError("signal script output", line)
    return out
