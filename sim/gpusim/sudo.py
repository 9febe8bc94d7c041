"""The stand-in ``sudo`` of a simulated node: only ``sudo -n CMD ARG...``, checked against a rule.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and run by
``<node>/sbin-sudo/sudo``, the first directory of the node's session PATH when the fleet is
started with ``sudo_rule=`` (the sudoers block of the README, see ``sudoers.readme_sudo_rule``).

What it does, as sudo 1.9 with that rule in ``/etc/sudoers.d`` does it:

- Only ``sudo -n CMD [ARG...]`` is accepted. Without ``-n`` sudo would ask for a password that
  an SSH session without a terminal cannot give; any other option is refused too.
- ``CMD`` without a slash is looked up in sudo's ``secure_path``, except ``nvidia-smi`` and the
  runtime programs (``docker``, ``podman``, ``crictl``, ``scontrol``, ``scancel``,
  ``systemctl``), which are the node's own stand-ins: found in the node's directory when the
  fleet installed them, not found otherwise (never this machine's own).
- The command (resolved path, then the arguments joined by single spaces) must match one of the
  rule's command patterns, with sudoers' wildcards (``sudoers.command_matches``).
- A refused command is never run. sudo 1.9 answers ``sudo -n`` for a command that no NOPASSWD
  rule allows with ``sudo: a password is required`` (exit 1): it would have to authenticate
  before it may even say no, and ``-n`` forbids asking. The log keeps sudo's reason
  (``Sorry, user gpubot is not allowed to execute '...' as root on NODE.``).
- Every call, run or refused, is appended to the node's log as one JSON line.

The rule file (JSON) is written by the fleet: ``user``, ``host``, ``runas``, ``nopasswd``,
``commands`` (patterns, with ``/dev/nvidia``, ``/usr/bin/nvidia-smi`` and ``/usr/bin/PROG`` of
each runtime program already rewritten to the node's device prefix and its own programs),
``nvidia_smi``, ``programs`` (name -> the node's path) and ``log``. The stand-in changes no
privilege: it runs the command as the session's own user (root, in the test suite).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from .sudoers import command_matches

SECURE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
PASSWORD_REQUIRED = "sudo: a password is required"
NO_TERMINAL = (
    "sudo: a terminal is required to read the password; either use the -S option to read from "
    "standard input or configure an askpass helper"
)
USAGE = "usage: sudo -n command [arg ...]  (gpusim: the only form this stand-in accepts)"
# Variables sudo's env_reset keeps (besides the ones it sets).
KEEP_ENV = ("TERM", "LANG", "LANGUAGE", "LC_ALL", "TZ", "COLORS", "DISPLAY", "XAUTHORITY")


def resolve(
    cmd: str, nvidia_smi: str | None = None, programs: dict[str, str] | None = None
) -> str | None:
    """Find ``cmd`` as sudo does (``secure_path``); ``nvidia-smi`` and ``programs`` (name ->
    path) are the node's own, and a missing one is not found rather than looked up here."""
    if "/" in cmd:
        path = os.path.abspath(cmd)
        return path if _executable(path) else None
    own = {**({"nvidia-smi": nvidia_smi} if nvidia_smi else {}), **(programs or {})}
    if cmd in own:
        return own[cmd] if _executable(own[cmd]) else None
    for d in SECURE_PATH:
        path = os.path.join(d, cmd)
        if _executable(path):
            return path
    return None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


# ---- the program -----------------------------------------------------------------------------


class _Refused(Exception):
    """Sudo refuses: the log's verdict and the lines it prints."""

    def __init__(self, verdict: str, *lines: str) -> None:
        super().__init__(verdict)
        self.verdict = verdict
        self.lines = lines


def main(argv: list[str], rule_path: str) -> int:
    """Run ``sudo ARGV`` under the rule in ``rule_path``; return the exit status if not exec'd."""
    with open(rule_path, encoding="utf-8") as f:
        rule: dict[str, Any] = json.load(f)
    record: dict[str, Any] = {
        "time": round(time.time(), 6),
        "node": rule["host"],
        "argv": list(argv),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "command": None,
        "allowed": False,
    }
    if argv == ["-n", "-l"]:
        record["verdict"] = "list"
        with contextlib.suppress(OSError):
            _log(rule["log"], record)
        print(listing(rule))
        return 0
    try:
        path = _check(argv, rule, record)
    except _Refused as no:
        record["verdict"] = no.verdict
        with contextlib.suppress(OSError):
            _log(rule["log"], record)
        for line in no.lines:
            print(line, file=sys.stderr)
        return 1
    record["allowed"] = True
    record["verdict"] = "run"
    try:
        _log(rule["log"], record)
    except OSError as exc:  # what is not logged is not run: the log is the proof
        print(f"sudo: cannot write the log {rule['log']}: {exc.strerror}", file=sys.stderr)
        return 1
    return _exec(path, argv[1], argv[2:], rule["runas"], record["command"])


def listing(rule: dict[str, Any], width: int = 80) -> str:
    """Return what ``sudo -n -l`` prints for ``rule``, wrapped at ``width`` as sudo 1.9 does
    (a long entry goes on over lines indented by eight spaces)."""
    who, host = rule["user"], rule["host"]
    tag = "NOPASSWD: " if rule.get("nopasswd") else ""
    words = f"({rule['runas']}) {tag}{', '.join(rule['commands'])}".split(" ")
    lines: list[str] = []
    cur = "   "
    for w in words:
        if len(cur) + 1 + len(w) > width and cur.strip():
            lines.append(cur)
            cur = "       "
        cur += " " + w
    lines.append(cur)
    secure = "\\:".join(SECURE_PATH)
    return (
        f"Matching Defaults entries for {who} on {host}:\n"
        f"    env_reset, secure_path={secure}\n\n"
        f"User {who} may run the following commands on {host}:\n" + "\n".join(lines)
    )


def _check(argv: list[str], rule: dict[str, Any], record: dict[str, Any]) -> str:
    """Return the program that ``sudo ARGV`` may run (``record`` gets its command line);
    raise ``_Refused`` otherwise (``record`` gets the reason, if the rule said no)."""
    if not argv:
        raise _Refused("usage", USAGE)
    if argv[0] != "-n":
        if argv[0].startswith("-"):
            raise _Refused("usage", f"sudo: option {argv[0]!r} is not supported here", USAGE)
        raise _Refused("no-n", NO_TERMINAL, PASSWORD_REQUIRED)
    if len(argv) == 1 or argv[1].startswith("-"):
        raise _Refused("usage", USAGE)
    cmd, args = argv[1], argv[2:]
    path = resolve(cmd, rule.get("nvidia_smi"), rule.get("programs"))
    if path is None:
        if "/" in cmd:
            raise _Refused("not-found", f"sudo: {cmd}: command not found")
        raise _Refused("denied", PASSWORD_REQUIRED)
    line = " ".join([path, *args])
    record["command"] = line
    allowed = any(command_matches(p, path, args) for p in rule["commands"])
    if not allowed or not rule.get("nopasswd", False):
        record["reason"] = (
            f"Sorry, user {rule['user']} is not allowed to execute '{line}' as "
            f"{rule['runas']} on {rule['host']}."
            if not allowed
            else "the rule has no NOPASSWD tag"
        )
        raise _Refused("denied", PASSWORD_REQUIRED)
    return path


def _exec(path: str, cmd: str, args: list[str], runas: str, line: str) -> int:
    """Exec ``path`` as ``cmd ARGS`` in sudo's environment; return 1 if that fails."""
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV or k.startswith("LC_")}
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    env.update(
        {
            "PATH": ":".join(SECURE_PATH),
            "HOME": "/root",
            "USER": runas,
            "LOGNAME": runas,
            "SHELL": "/bin/sh",
            "SUDO_COMMAND": line,
            "SUDO_USER": user,
            "SUDO_UID": str(os.getuid()),
            "SUDO_GID": str(os.getgid()),
        }
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, [cmd, *args], env)
    except OSError as exc:
        print(f"sudo: unable to execute {path}: {exc.strerror}", file=sys.stderr)
    return 1


def _log(path: str, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line, in one O_APPEND write: concurrent lines stay whole."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(28, "short write")
    finally:
        os.close(fd)


def read_log(path: str) -> list[dict[str, Any]]:
    """Return every record ``_log`` appended to ``path``, oldest first ([] if there is none)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], sys.argv[1]))
