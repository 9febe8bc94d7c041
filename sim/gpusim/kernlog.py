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

``logger [-t TAG] [--] MESSAGE...`` (util-linux's, as gpubot calls it) appends one user record
to ``<state>/syslog.log`` (one JSON object a line: time, tag, message), and ``journalctl -t TAG
[-o short-iso]`` prints the records of that tag as ``2026-12-02T05:50:01+0000 HOST TAG:
MESSAGE``. ``<state>/logger.mode`` says how logger behaves (``LOGGER_MODES``):

- ``journal`` (the default): the record is written, exit 0.
- ``no-socket``: no syslog socket (a container without journald): nothing is written, and
  logger says what util-linux's says then, ``logger: socket /dev/log: No such file or
  directory`` (verbatim from https://github.com/docker-library/python/issues/576), exit 1.
- ``hang``: logger blocks (a journal that does not read its socket) for 60 s, writing nothing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import UTC, datetime

LOG_FILE = "kernel.log"
MODE_FILE = "kernel.mode"
MODES = ("journal", "dmesg", "no-journal-group", "denied")
SYSLOG_FILE = "syslog.log"
LOGGER_MODE_FILE = "logger.mode"
LOGGER_MODES = ("journal", "no-socket", "hang")
NO_SOCKET = "logger: socket /dev/log: No such file or directory"
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


def user_records(state_dir: str) -> list[dict[str, object]]:
    """Return the node's ``logger`` records (time, tag, message), oldest first."""
    try:
        with open(os.path.join(state_dir, SYSLOG_FILE), encoding="utf-8") as f:
            return [json.loads(x) for x in f if x.strip()]
    except FileNotFoundError:
        return []


def logger_mode(state_dir: str) -> str:
    """Return how the node's ``logger`` behaves (``LOGGER_MODES``)."""
    try:
        with open(os.path.join(state_dir, LOGGER_MODE_FILE), encoding="ascii") as f:
            m = f.read().strip()
    except FileNotFoundError:
        return "journal"
    return m if m in LOGGER_MODES else "journal"


def _logger(argv: list[str], state_dir: str) -> int:
    tag = os.environ.get("USER", "gpusim")
    words: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            words += argv[i + 1 :]
            break
        if a in ("-t", "--tag") and i + 1 < len(argv):
            tag, i = argv[i + 1], i + 2
            continue
        if a.startswith("-") and a != "-":
            print(f"logger: gpusim's stand-in has no option {a}", file=sys.stderr)
            return 1
        words.append(a)
        i += 1
    m = logger_mode(state_dir)
    if m == "no-socket":
        print(NO_SOCKET, file=sys.stderr)
        return 1
    if m == "hang":
        time.sleep(60)
        return 1
    path = os.path.join(state_dir, SYSLOG_FILE)
    record = json.dumps({"at": time.time(), "tag": tag, "message": " ".join(words)})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (record + "\n").encode())
    finally:
        os.close(fd)
    return 0


def _by_tag(argv: list[str], state_dir: str) -> int:
    tag = argv[argv.index("-t") + 1] if argv.index("-t") + 1 < len(argv) else ""
    host = socket.gethostname()
    for r in user_records(state_dir):
        if r.get("tag") == tag:
            at = r.get("at")
            ts = datetime.fromtimestamp(float(at) if isinstance(at, int | float) else 0, UTC)
            print(f"{ts.strftime('%Y-%m-%dT%H:%M:%S+0000')} {host} {tag}: {r.get('message')}")
    return 0


def _journal(argv: list[str], state_dir: str) -> int:
    if "-t" in argv:  # user records of one tag (logger's)
        return _by_tag(argv, state_dir)
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
    """Run stand-in ``prog`` (``journalctl``, ``dmesg`` or ``logger``) against the node's logs."""
    try:
        if prog == "journalctl":
            return _journal(argv, state_dir)
        if prog == "dmesg":
            return _dmesg(argv, state_dir)
        if prog == "logger":
            return _logger(argv, state_dir)
    except BrokenPipeError:
        return 141
    print(f"gpusim: no stand-in called {prog!r}", file=sys.stderr)
    return 127
