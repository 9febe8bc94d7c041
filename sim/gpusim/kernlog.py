"""The stand-in ``journalctl`` and ``dmesg`` of a simulated node: its kernel log.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and run by the
launchers in ``<node>/kernlog-bin/``, first on every session's PATH, so a sweep never reads this
machine's own kernel log. The log is ``<state>/kernel.log``, one record a line,
``SEQ<TAB>UNIX-TIME<TAB>MESSAGE`` (written by ``gpusim.kernlog_host.KernelLog``), and its mode
``<state>/kernel.mode``:

- ``journal`` (the default): ``journalctl -k`` answers; ``dmesg`` too.
- ``dmesg``: no journal (a container without journald): journalctl says ``No journal files were
  found.`` as systemd's does, and exits 1.
- ``no-journal-group``: the SSH user is in neither ``systemd-journal`` nor ``adm``: journalctl
  shows no kernel line and prints systemd's hint on stderr (``Hint: You are currently not seeing
  messages from other users and the system. ...``); dmesg answers (``dmesg_restrict = 0``).
- ``denied``: that, and ``dmesg_restrict = 1``: dmesg says ``dmesg: read kernel buffer failed:
  Operation not permitted`` (util-linux), exit 1.

``journalctl -k [-q] [--no-pager] -o short-iso --show-cursor [-n N] [--after-cursor=C |
--since=-Ns]`` (``-n`` with a cursor or ``--since``: the oldest N after it, as journalctl does
with a cursor; alone: the newest N) prints ``2026-12-02T05:50:01+0000 HOST kernel: MESSAGE``
per record (journalctl(1), short-iso), then ``-- cursor: s=gpusim;i=HEX`` after the last one
shown (none when nothing is shown); an unknown cursor: ``Failed to seek to cursor: Invalid
argument``, exit 1.
``dmesg --time-format iso`` prints ``2026-12-02T05:50:01,123456+00:00 MESSAGE`` (dmesg(1)).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import UTC, datetime

LOG_FILE = "kernel.log"
MODE_FILE = "kernel.mode"
MODES = ("journal", "dmesg", "no-journal-group", "denied")
HINT = (
    "Hint: You are currently not seeing messages from other users and the system.\n"
    "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
    "      Pass -q to turn off this notice."
)


def records(state_dir: str) -> list[tuple[int, float, str]]:
    """Return the node's kernel-log records, oldest first."""
    out: list[tuple[int, float, str]] = []
    try:
        with open(os.path.join(state_dir, LOG_FILE), encoding="utf-8", errors="replace") as f:
            for line in f:
                seq, at, msg = line.rstrip("\n").split("\t", 2)
                out.append((int(seq), float(at), msg))
    except FileNotFoundError:
        pass
    return out


def mode(state_dir: str) -> str:
    """Return the node's kernel-log mode (``MODES``)."""
    try:
        with open(os.path.join(state_dir, MODE_FILE), encoding="ascii") as f:
            m = f.read().strip()
    except FileNotFoundError:
        return "journal"
    return m if m in MODES else "journal"


def _journal(argv: list[str], state_dir: str) -> int:
    m = mode(state_dir)
    if m == "dmesg":
        print("No journal files were found.", file=sys.stderr)
        return 1
    if m in ("no-journal-group", "denied"):
        print(HINT, file=sys.stderr)
        return 0
    recs = records(state_dir)
    after = next((a.split("=", 1)[1] for a in argv if a.startswith("--after-cursor=")), None)
    since = next((a.split("=", 1)[1] for a in argv if a.startswith("--since=")), None)
    if after is not None:
        if not after.startswith("s=gpusim;i="):
            print("Failed to seek to cursor: Invalid argument", file=sys.stderr)
            return 1
        last = int(after.rsplit("=", 1)[1], 16)
        recs = [r for r in recs if r[0] > last]
    elif since is not None and since.startswith("-") and since.endswith("s"):
        start = time.time() - float(since[1:-1])
        recs = [r for r in recs if r[1] >= start]
    if "-n" in argv[:-1]:  # after a cursor or --since: the oldest N (journalctl's -n there)
        n = int(argv[argv.index("-n") + 1])
        recs = recs[:n] if after is not None or since is not None else recs[-n:]
    host = socket.gethostname()
    for _seq, at, msg in recs:
        ts = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
        print(f"{ts} {host} kernel: {msg}")
    if recs and "--show-cursor" in argv:
        print(f"-- cursor: s=gpusim;i={recs[-1][0]:x}")
    return 0


def _dmesg(argv: list[str], state_dir: str) -> int:
    if mode(state_dir) == "denied":
        print("dmesg: read kernel buffer failed: Operation not permitted", file=sys.stderr)
        return 1
    for _seq, at, msg in records(state_dir):
        ts = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
        print(f"{ts} {msg}")
    return 0


def main(prog: str, argv: list[str], state_dir: str) -> int:
    """Run stand-in ``prog`` (``journalctl`` or ``dmesg``) against the node's kernel log."""
    try:
        if prog == "journalctl":
            return _journal(argv, state_dir)
        if prog == "dmesg":
            return _dmesg(argv, state_dir)
    except BrokenPipeError:
        return 141
    print(f"gpusim: no stand-in called {prog!r}", file=sys.stderr)
    return 127
