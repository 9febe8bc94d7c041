"""The kernel-log read of a sweep: one bounded exec per node, and its parser (pure).

Sources, in order (the first one the SSH user may read is used):

1. ``journalctl -k -o short-iso --show-cursor -n MAX_ENTRIES`` (never ``-q``: it silences the
   hint that the account may not read the system journal) after the previous read's cursor
   (a process's first read: ``--since`` the Xid window). With a cursor, ``-n`` takes the OLDEST
   entries after it, so a backlog (a faulting job can grow one) is read in bounded steps, each
   moving the cursor: no step outgrows its budget and times out for good. A full step
   (``@gpubot entries N``) means more may wait; the watch takes the next step within the same
   budget (``services.xid_watch``), so a fatal line behind a flood is still read. (With
   ``--since``, newer systemd takes the newest entries: a first read after a restart may skip
   the oldest part of a backlog.) It needs the ``systemd-journal`` or ``adm`` group (or root).
2. ``dmesg --time-format iso``, keeping lines newer than the last one seen (the ring buffer is
   read whole; so are its counts, and the watch summarises only their increase). It needs
   ``kernel.dmesg_restrict = 0``.

gpubot never uses sudo for this: a node where neither can be read says so once, in the log, and
raises no finding.

Bounded whatever the node logs, and not to be flooded by a user: only driver lines (the
driver's words right after the timestamp and ``HOST kernel:``) and the cursor pass ``grep``,
``cut`` to ``MAX_LINE_BYTES``. A user's job writes as many application-error lines
(``APP_CODES``) as it faults, so those have their own cap (``MAX_APP_LINES``) and every other
driver line (an Xid 79, an SXid) is kept first, up to ``MAX_LINES``. A count per (bus, code)
(``@gpubot count``, at most ``MAX_COUNTS``) travels beside them, so what a cap dropped is
summarised, never lost, and a fatal code whose lines were all dropped is still found.

Trust: a user controls text inside some kernel lines (an Xid's ``name=`` is the process's comm).
So a line counts only when the driver's own words START its message (``NVRM: Xid (``,
``nvidia-nvswitchN: SXid (``), the code is the number right after the bus id, the name is for
display only (escaped), and the pid only tells faulting processes apart and finds their owners:
it never decides what is signalled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpubot.core.health.codes import XIDS

MAX_LINES = 400  # driver lines other than application errors (the newest)
MAX_APP_LINES = 100  # application-error lines (the newest): a user's own job writes these
MAX_COUNTS = 256  # (bus, code) counts: GPUs x codes, never a user's choice
MAX_LINE_BYTES = 512
MAX_ENTRIES = 5000  # journal entries one read takes: a backlog is read in steps of this many
MARK = "@gpubot"

# The codes a job's own fault writes (its owner's business; any user can write many of them).
APP_CODES = tuple(sorted(c.code for c in XIDS.values() if c.fault == "application"))

# $1: the journal cursor ("" none), $2: since (journalctl's "-3600s"), $3: lines, $4: bytes,
# $5: the application codes ("13|31|..."), $6: application lines, $7: counts, $8: the journal
# entries one read takes (the oldest after the cursor: ``journalctl -n`` with a cursor).
# M: the MIG attribution the driver writes after the bus id (" GPU-I:05", " GPU-I:01 GPU-CI:02";
# kernel_rc.c's XID_PRINT_WITH_ATTR): every form of the prefix ``parse_event`` reads.
# D: a driver line (the driver's words right after the timestamp, or "HOST kernel: " after it,
# as journalctl -o short-iso and dmesg --time-format iso write them: nothing a user writes comes
# first); A: such a line of an application code. The counts are taken of the lines D passed, so
# a forged Xid inside another message is never counted.
_SCRIPT = r"""export LC_ALL=C
case $5 in ''|*[!0-9\|]*) echo 'gpubot-kernlog: bad codes' >&2; exit 2 ;; esac
case $8 in ''|*[!0-9]*) echo 'gpubot-kernlog: bad entries' >&2; exit 2 ;; esac
B='[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}'
M='( GPU-I:[0-9]{1,3}( GPU-CI:[0-9]{1,3})?)?'
P='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ ]+ ([^ ]+ kernel: )?'
D=$P'(NVRM: Xid \((PCI:)?'$B$M'\): [0-9]+|'
D+='nvidia-nvswitch[0-9]*: SXid \(PCI:'$B'(\.[0-9A-Fa-f])?\): [0-9]+)'
A=$P'NVRM: Xid \((PCI:)?'$B$M'\): ('$5')([^0-9]|$)'
X='s/^[^ ]+ ([^ ]+ kernel: )?NVRM: Xid \((PCI:)?('$B')'$M'\): ([0-9]+).*/x \3 \6/p'
S='s/^[^ ]+ ([^ ]+ kernel: )?nvidia-nvswitch[0-9]*: SXid \(PCI:('$B')[^)]*\): ([0-9]+).*/s \2 \3/p'
pick() {  # $1: the source's text, $2: lines, $3: bytes, $4: application lines, $5: counts
  local d
  d=$(printf '%s\n' "$1" | grep -a -E "$D" | cut -b "1-$3")
  if [ -n "$d" ]; then  # the lines, then their counts; the cursor last
    printf '%s\n' "$d" | grep -a -v -E "$A" | tail -n "$2"
    printf '%s\n' "$d" | grep -a -E "$A" | tail -n "$4"
    printf '%s\n' "$d" | sed -n -E -e "$X" -e "$S" | sort | uniq -c | head -n "$5" |
      sed 's/^ */@gpubot count /'
  fi
  printf '%s\n' "$1" | grep -a -E '^-- cursor: |^Failed to seek' | tail -n 2 | cut -b "1-$3"
}
took() {  # the journal entries a step took (short-iso: each starts with its time)
  printf '%s entries %s\n' @gpubot "$(printf '%s\n' "$1" | grep -a -c -E '^[0-9]{4}-[0-9]{2}-')"
}
if command -v journalctl >/dev/null 2>&1; then
  if [ -n "$1" ]; then a="--after-cursor=$1"; else a="--since=$2"; fi
  all=$(journalctl -k --no-pager -o short-iso --show-cursor -n "$8" "$a" 2>&1); rc=$?
  case $'\n'$all in
    *$'\n'"No journal files were opened"*|*$'\n'"Hint: You are currently not seeing"*)
      printf '%s journal-denied not in the systemd-journal or adm group\n' @gpubot ;;
    *$'\n'"No journal files were found"*)
      printf '%s journal-denied no journal on the node\n' @gpubot ;;
    *$'\n'"Failed to seek"*)  # the cursor is gone: the parser starts over
      printf '%s source journal\n' @gpubot; took "$all"; pick "$all" "$3" "$4" "$6" "$7"; exit 0 ;;
    *)
      if [ "$rc" = 0 ]; then
        printf '%s source journal\n' @gpubot; took "$all"; pick "$all" "$3" "$4" "$6" "$7"
        exit 0
      fi
      printf '%s journal-denied journalctl exit %s: %s\n' @gpubot "$rc" "${all:0:200}" |
        head -n 1 ;;
  esac
fi
if out=$(dmesg --time-format iso 2>&1); then
  printf '%s source dmesg\n' @gpubot; pick "$out" "$3" "$4" "$6" "$7"
else
  printf '%s dmesg-denied %s\n' @gpubot "${out:0:200}" | head -n 1
fi
"""


def kernlog_argv(cursor: str | None, since_s: float, entries: int = MAX_ENTRIES) -> list[str]:
    """Return the argv of one read: after ``cursor`` (a journal cursor), else ``since_s`` ago,
    at most ``entries`` journal entries."""
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
        "|".join(map(str, APP_CODES)),
        str(MAX_APP_LINES),
        str(MAX_COUNTS),
        str(max(1, int(entries))),
    ]


CountKey = tuple[bool, str, int]  # (an SXid, bus "dddd:bb:dd", code)


@dataclass(frozen=True)
class KernelRead:
    """What one read said: its source (``journal``/``dmesg``; None: neither could be read),
    the driver lines kept, in order, the journal's cursor after them, why nothing could be read,
    and how many driver lines the read held per (SXid, bus, code), kept or not."""

    source: str | None
    lines: tuple[str, ...]
    cursor: str | None = None
    denied: tuple[str, ...] = ()
    cursor_lost: bool = False
    counts: Mapping[CountKey, int] | None = None  # None: the node sent none (nothing to count)
    entries: int | None = None  # the journal entries the step took (None: dmesg, or not said)


_COUNT = re.compile(
    rf"^{MARK} count (\d{{1,9}}) ([xs]) ([0-9a-f]{{4}}:[0-9a-f]{{2}}:[0-9a-f]{{2}}) (\d{{1,9}})$",
    re.IGNORECASE,
)
_ENTRIES = re.compile(rf"^{MARK} entries (\d{{1,9}})$")


def parse_kernlog(stdout: str) -> KernelRead:
    """Parse the read's output (never raises: an unexpected line is ignored)."""
    source: str | None = None
    cursor: str | None = None
    lines: list[str] = []
    denied: list[str] = []
    counts: dict[CountKey, int] = {}
    lost = False
    entries: int | None = None
    for line in stdout.splitlines():
        if (n := _ENTRIES.match(line)) is not None:
            entries = int(n[1])
        elif (c := _COUNT.match(line)) is not None:
            key = (c[2] == "s", c[3].lower(), int(c[4]))
            counts[key] = counts.get(key, 0) + int(c[1])  # the bus's case: one count
        elif line.startswith(f"{MARK} source "):
            source = line.split(" ", 2)[2].strip()
        elif line.startswith(f"{MARK} ") and "-denied" in line.split(" ", 2)[1]:
            denied.append(line[len(MARK) + 1 :].strip()[:300])
        elif line.startswith("-- cursor: "):
            cursor = line[len("-- cursor: ") :].strip() or None
        elif line.startswith("Failed to seek"):  # the cursor is gone (journal vacuumed)
            lost = True
        elif source is not None:
            lines.append(line)
    return KernelRead(source, tuple(lines), cursor, tuple(denied), lost, counts or None, entries)


@dataclass(frozen=True)
class XidEvent:
    """One Xid (or SXid) line, or (``count`` > 1, ``summary``) the lines of one (bus, code) a
    read dropped at its cap. ``pid`` and ``name`` are the kernel's copy of the faulting process:
    the pid is the kernel's own number; the name is what the process calls itself (display only)."""

    sxid: bool
    code: int
    bus: str  # normalized "dddd:bb:dd" (an SXid: the switch's "dddd:bb:dd")
    at: float | None  # unix time from the line's timestamp (None: unknown)
    text: str  # the driver's words after the code (and pid/name)
    pid: str | None = None
    name: str | None = None
    line: str = ""  # the whole line as read (for dedupe)
    count: int = 1  # how many lines this stands for
    summary: bool = False  # the lines a cap dropped, known only by their count
    mig: str = ""  # the MIG instance the driver named ("GPU-I:05", "GPU-I:01 GPU-CI:02"), or ""

    @property
    def key(self) -> CountKey:
        """Return what the read's counts are kept by."""
        return (self.sxid, self.bus, self.code)


def is_app(key: CountKey) -> bool:
    """Whether lines of ``key`` are an application error's (their own cap on the node)."""
    return not key[0] and key[2] in APP_CODES


def summaries(
    counts: Mapping[CountKey, int] | None, kept: Sequence[XidEvent], after: float | None = None
) -> list[XidEvent]:
    """Return one summary event per (SXid, bus, code) with more lines than ``kept`` holds.

    A cap keeps the newest lines of its class (application errors, the rest), so what it
    dropped is older than every line of that class it kept. ``after`` (dmesg, which has no
    cursor and reads its whole ring buffer each time): the time of the newest line already seen;
    a class with a kept line at or before it dropped nothing new. Each summary is timed like the
    oldest line of its class that was kept (None: the read's time), so it stands in the window
    as long as they do.
    """
    if not counts:
        return []
    kept_n: dict[CountKey, int] = {}
    oldest: dict[bool, float] = {}
    for e in kept:
        kept_n[e.key] = kept_n.get(e.key, 0) + 1
        if e.at is not None:
            oldest[is_app(e.key)] = min(oldest.get(is_app(e.key), e.at), e.at)
    out: list[XidEvent] = []
    for key, n in sorted(counts.items()):
        dropped = n - kept_n.get(key, 0)
        at = oldest.get(is_app(key))
        if dropped <= 0 or (after is not None and at is not None and at <= after):
            continue
        sxid, bus, code = key
        text = f"{dropped} more line{'s' if dropped != 1 else ''}, summarised by the read's cap"
        line = f"{MARK} summary {'s' if sxid else 'x'} {bus} {code} {n}"
        out.append(XidEvent(sxid, code, bus, at, text, line=line, count=dropped, summary=True))
    return out


def increase(
    counts: Mapping[CountKey, int] | None, before: Mapping[CountKey, int]
) -> dict[CountKey, int]:
    """Return how many lines of each key are new since ``before`` (dmesg: both count the whole
    ring buffer). A key whose count fell (the buffer wrapped, or was cleared) counts no new line:
    a summary may then say too few, never one already said."""
    out = {k: n - before.get(k, 0) for k, n in (counts or {}).items()}
    return {k: n for k, n in out.items() if n > 0}


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
# Every prefix the driver writes (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c,
# XID_PRINT_WITH_ATTR): "Xid (PCI:dddd:bb:dd)", on a MIG GPU "Xid (PCI:dddd:bb:dd GPU-I:05)" and
# "Xid (PCI:dddd:bb:dd GPU-I:01 GPU-CI:02)"; older drivers: "Xid (dddd:bb:dd)" (NVIDIA's Xid doc).
_XID = re.compile(
    r"^NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
    r"( GPU-I:\d{1,3}(?: GPU-CI:\d{1,3})?)?\): (\d+)"
)
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
    try:
        return datetime.fromisoformat(f"{m.group(1)}.{frac}{m.group(3) or 'Z'}").timestamp()
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
        mig = (x.group(2) or "").strip()
        code = int(x.group(3))
        return XidEvent(False, code, x.group(1).lower(), at, rest, pid, name, line, mig=mig)
    s = _SXID.match(msg)
    if s is not None:
        rest = msg[s.end() :].removeprefix(", ")
        return XidEvent(True, int(s.group(2)), s.group(1).lower(), at, rest, line=line)
    return None


def gpu_bus(bus_id: str | None) -> str | None:
    """Return nvidia-smi's bus id ("00000000:52:00.0") as an Xid line writes it ("0000:52:00")."""
    if not bus_id:
        return None
    # Lenient on purpose: NVML's bus id (the local path) is not checked against nvidia-smi's form
    # first, and a legacy 4-digit domain or padding must still map the Xid line to its GPU.
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, dev = parts
    return f"{domain[-4:].rjust(4, '0')}:{bus[-2:].rjust(2, '0')}:{dev.split('.')[0][-2:]}"
