"""The kernel-log read of a sweep: one bounded exec per node, and its parser (pure).

Sources, in order (the first one the SSH user may read is used):

1. ``journalctl -k -o short-iso --show-cursor`` (never ``-q``: it silences the hint that says the
   account may not read the system journal) after the cursor of the previous read (the first
   read of a process: ``--since`` the Xid window). Reading the kernel's messages from the system
   journal needs membership of the ``systemd-journal`` or ``adm`` group (or root); without it
   journalctl shows the user's own journal only and says so.
2. ``dmesg --time-format iso``, keeping lines newer than the last one seen. It needs
   ``kernel.dmesg_restrict = 0`` (Debian and Ubuntu set 1: then root or CAP_SYSLOG only).

gpubot never uses sudo for this (no sudoers line is needed): a node where neither can be read
says so once, in the log, and raises no finding.

Bounded whatever the node logs: only driver lines (``NVRM: Xid``, ``SXid``) and the cursor pass
``grep``; ``tail`` keeps the newest ``MAX_LINES``, ``cut`` each to ``MAX_LINE_BYTES``.

Trust: the kernel writes these lines, but a user controls text inside some of them (the
``name=`` of an Xid line is the process's comm; other kernel messages quote a file name). So a
line counts only when the driver's own words START its message (``NVRM: Xid (``, ``nvidia-
nvswitchN: SXid (``), the code is the number the driver writes right after the bus id, and the
pid and name are kept for display only (``core.xid`` shows them escaped, never acts on them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

MAX_LINES = 400
MAX_LINE_BYTES = 512
MARK = "@gpubot"

# $1: the journal cursor ("" none), $2: since (journalctl's "-3600s"), $3: lines, $4: bytes.
_SCRIPT = r"""LC_ALL=C
pick() {
  grep -a -E '(NVRM: Xid|SXid) \(|^-- cursor: |^Failed to seek' | tail -n "$1" | cut -b "1-$2"
}
if command -v journalctl >/dev/null 2>&1; then
  if [ -n "$1" ]; then a="--after-cursor=$1"; else a="--since=$2"; fi
  all=$(journalctl -k --no-pager -o short-iso --show-cursor "$a" 2>&1); rc=$?
  case $'\n'$all in
    *$'\n'"No journal files were opened"*|*$'\n'"Hint: You are currently not seeing"*)
      printf '%s journal-denied not in the systemd-journal or adm group\n' @gpubot ;;
    *$'\n'"No journal files were found"*)
      printf '%s journal-denied no journal on the node\n' @gpubot ;;
    *$'\n'"Failed to seek"*)  # the cursor is gone: the parser starts over
      printf '%s source journal\n' @gpubot; printf '%s\n' "$all" | pick "$3" "$4"; exit 0 ;;
    *)
      if [ "$rc" = 0 ]; then
        printf '%s source journal\n' @gpubot; printf '%s\n' "$all" | pick "$3" "$4"; exit 0
      fi
      printf '%s journal-denied journalctl exit %s: %s\n' @gpubot "$rc" "${all:0:200}" |
        head -n 1 ;;
  esac
fi
if out=$(dmesg --time-format iso 2>&1); then
  printf '%s source dmesg\n' @gpubot; printf '%s\n' "$out" | pick "$3" "$4"
else
  printf '%s dmesg-denied %s\n' @gpubot "${out:0:200}" | head -n 1
fi
"""


def kernlog_argv(cursor: str | None, since_s: float) -> list[str]:
    """Return the argv of one read: after ``cursor`` (a journal cursor), else ``since_s`` ago."""
    since = f"-{max(1, int(since_s))}s"
    return [
        "bash",
        "-c",
        _SCRIPT,
        "gpubot-kernlog",
        cursor or "",
        since,
        str(MAX_LINES),
        str(MAX_LINE_BYTES),
    ]


@dataclass(frozen=True)
class KernelRead:
    """What one read said: its source (``journal``/``dmesg``; None: neither could be read),
    the driver lines in order, the journal's cursor after them, and why nothing could be read."""

    source: str | None
    lines: tuple[str, ...]
    cursor: str | None = None
    denied: tuple[str, ...] = ()
    cursor_lost: bool = False


def parse_kernlog(stdout: str) -> KernelRead:
    """Parse the read's output (never raises: an unexpected line is ignored)."""
    source: str | None = None
    cursor: str | None = None
    lines: list[str] = []
    denied: list[str] = []
    lost = False
    for line in stdout.splitlines():
        if line.startswith(f"{MARK} source "):
            source = line.split(" ", 2)[2].strip()
        elif line.startswith(f"{MARK} ") and "-denied" in line.split(" ", 2)[1]:
            denied.append(line[len(MARK) + 1 :].strip()[:300])
        elif line.startswith("-- cursor: "):
            cursor = line[len("-- cursor: ") :].strip() or None
        elif line.startswith("Failed to seek"):  # the cursor is gone (journal vacuumed)
            lost = True
        elif source is not None:
            lines.append(line)
    return KernelRead(source, tuple(lines), cursor, tuple(denied), lost)


@dataclass(frozen=True)
class XidEvent:
    """One Xid (or SXid) line. ``pid`` and ``name`` are the kernel's copy of what a user
    controls: display only."""

    sxid: bool
    code: int
    bus: str  # normalized "dddd:bb:dd" (an SXid: the switch's "dddd:bb:dd")
    at: float | None  # unix time from the line's timestamp (None: unknown)
    text: str  # the driver's words after the code (and pid/name)
    pid: str | None = None
    name: str | None = None
    line: str = ""  # the whole line as read (for dedupe)


_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d{1,9}))?([+-]\d\d:?\d\d|Z)?")
# What may stand before the driver's words, and nothing else: journalctl -o short-iso's "TS HOST
# kernel: ", dmesg --time-format iso's "TS ", and (in the corpus) syslog's "Mon DD HH:MM:SS HOST
# kernel: " (or "kernel: " alone), dmesg -x's "kern  :err   : ", dmesg's "[ seconds] " or
# dmesg -T's "[Sun Feb 23 16:24:18 2025] ". Timestamps and a host name only:
# no text a user controls can come first.
_PREFIX = re.compile(
    r"^(?:(?:(?:(?P<jts>\d{4}-\d\d-\d\dT\S+)|[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d)"
    r"(?: \S+)? )?kernel: )?(?:kern +:[a-z]+ *: )?(?:(?P<dts>\d{4}-\d\d-\d\dT\S+) )?"
    r"(?:\[ *\d+\.\d+\] |\[[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4}\] )?"
)
_XID = re.compile(r"^NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\): (\d+)")
_SXID = re.compile(
    r"^nvidia-nvswitch\d*: SXid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
    r"(?:\.[0-9A-Fa-f])?\): (\d+)"
)
_PID = re.compile(r"^pid=('?<unknown>'?|'N/A'|N/A|\d+)(?:, |$)")
_NAME = re.compile(r"^name=(.{0,64}?)(?:, |$)")


def parse_time(ts: str) -> float | None:
    """Return the unix time of an ISO timestamp as journalctl or dmesg writes it, or None."""
    m = _TS.match(ts)
    if m is None:
        return None
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    tz = m.group(3) or "+00:00"
    if tz == "Z":
        tz = "+00:00"
    elif ":" not in tz:
        tz = f"{tz[:3]}:{tz[3:]}"
    try:
        return datetime.fromisoformat(f"{m.group(1)}.{frac}{tz}").timestamp()
    except ValueError:
        return None


def parse_event(line: str) -> XidEvent | None:
    """Return the Xid or SXid of one kernel-log line, or None (not the driver's own line)."""
    m = _PREFIX.match(line)
    if m is None:  # cannot be: every part is optional
        return None
    msg = line[m.end() :]
    at = parse_time(m.group("jts") or m.group("dts") or "")
    x = _XID.match(msg)
    if x is not None:
        rest = msg[x.end() :].removeprefix(", ")
        pid = name = None
        if (p := _PID.match(rest)) is not None:
            pid, rest = p.group(1).strip("'"), rest[p.end() :]
            if (n := _NAME.match(rest)) is not None:
                name, rest = n.group(1), rest[n.end() :]
        return XidEvent(False, int(x.group(2)), x.group(1).lower(), at, rest, pid, name, line)
    s = _SXID.match(msg)
    if s is not None:
        rest = msg[s.end() :].removeprefix(", ")
        return XidEvent(True, int(s.group(2)), s.group(1).lower(), at, rest, line=line)
    return None


def gpu_bus(bus_id: str | None) -> str | None:
    """Return nvidia-smi's bus id ("00000000:52:00.0") as an Xid line writes it ("0000:52:00")."""
    if not bus_id:
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, dev = parts
    return f"{domain[-4:].rjust(4, '0')}:{bus[-2:].rjust(2, '0')}:{dev.split('.')[0][-2:]}"
