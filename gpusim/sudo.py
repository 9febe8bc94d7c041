"""The stand-in ``sudo`` of a simulated node: only ``sudo -n CMD ARG...``, checked against a rule.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and run by
``<node>/sbin-sudo/sudo``, the first directory of the node's session PATH when the fleet is
started with ``sudo_rule=`` (the sudoers block of the README, see ``readme_sudo_rule``).

What it does, as sudo 1.9 with that rule in ``/etc/sudoers.d`` does it:

- Only ``sudo -n CMD [ARG...]`` is accepted. Without ``-n`` sudo would ask for a password that
  an SSH session without a terminal cannot give; any other option is refused too.
- ``CMD`` without a slash is looked up in sudo's ``secure_path``, except ``nvidia-smi`` and the
  runtime programs (``docker``, ``podman``, ``crictl``, ``scontrol``, ``scancel``,
  ``systemctl``), which are the node's own stand-ins: found in the node's directory when the
  fleet installed them, not found otherwise (never this machine's own).
- The command (resolved path, then the arguments joined by single spaces) must match one of the
  rule's command patterns, with sudoers' wildcards: in the path, ``*`` and ``?`` stop at ``/``;
  in the arguments, ``*`` matches anything, spaces and slashes included; ``[0-9]`` is a class;
  a pattern without arguments allows any, ``""`` none. An exact path also matches the same
  file reached through another name (``/bin/kill`` for ``/usr/bin/kill``), as sudo compares
  device and inode.
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
import re
import sys
import time
from typing import Any

SECURE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
PASSWORD_REQUIRED = "sudo: a password is required"
NO_TERMINAL = (
    "sudo: a terminal is required to read the password; either use the -S option to read from "
    "standard input or configure an askpass helper"
)
USAGE = "usage: sudo -n command [arg ...]  (gpusim: the only form this stand-in accepts)"
# Variables sudo's env_reset keeps (besides the ones it sets).
KEEP_ENV = ("TERM", "LANG", "LANGUAGE", "LC_ALL", "TZ", "COLORS", "DISPLAY", "XAUTHORITY")
_WILD = frozenset("*?[")


# ---- the sudoers block ----------------------------------------------------------------------


def readme_sudo_rule(readme_path: str | os.PathLike[str]) -> str:
    """Return the fenced sudoers block that follows "A restricted sudoers rule" in a README."""
    with open(readme_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next((i for i, ln in enumerate(lines) if "A restricted sudoers rule" in ln), None)
    if start is None:
        raise ValueError(f"{readme_path}: no section 'A restricted sudoers rule'")
    fences = [i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("```")]
    fence = fences[0] if fences else None
    if fence is None:
        raise ValueError(f"{readme_path}: no fenced block after 'A restricted sudoers rule'")
    indent = len(lines[fence]) - len(lines[fence].lstrip())
    body: list[str] = []
    for ln in lines[fence + 1 :]:
        if ln.strip().startswith("```"):
            return "".join(f"{b[indent:] if b[:indent].isspace() else b.lstrip()}\n" for b in body)
        body.append(ln)
    raise ValueError(f"{readme_path}: the sudoers block is not closed")


def parse_sudoers(text: str) -> dict[str, Any]:
    """Parse the small sudoers subset of the README: ``Cmnd_Alias`` lines and one user spec.

    Returns ``{"user", "runas", "nopasswd", "commands"}``; raises ``ValueError`` for anything
    else (``Defaults``, negation, other aliases, several users), rather than guess.
    """
    aliases: dict[str, list[str]] = {}
    specs: list[tuple[str, str, bool, list[str]]] = []
    for line in _logical_lines(text):
        if line.startswith("Cmnd_Alias"):
            for part in _split_unescaped(line[len("Cmnd_Alias") :], ":"):
                name, eq, body = part.partition("=")
                name = name.strip()
                if not eq or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                    raise ValueError(f"bad Cmnd_Alias: {line!r}")
                aliases[name] = [c.strip() for c in _split_unescaped(body, ",") if c.strip()]
            continue
        m = re.fullmatch(
            r"(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]*)\s+ALL\s*=\s*"
            r"(?:\((?P<runas>[^)]*)\)\s*)?(?P<tags>(?:[A-Z_]+:\s*)*)(?P<cmds>.+)",
            line,
        )
        if m is None:
            raise ValueError(f"unsupported sudoers line: {line!r}")
        tags = re.findall(r"[A-Z_]+", m["tags"])
        if set(tags) - {"NOPASSWD", "PASSWD"}:
            raise ValueError(f"unsupported tag in {line!r}")
        runas = (m["runas"] or "root").strip()
        if runas not in ("root", "root : root", "ALL"):
            raise ValueError(f"unsupported run-as list ({runas}) in {line!r}")
        cmds: list[str] = []
        for c in (c.strip() for c in _split_unescaped(m["cmds"], ",")):
            if c.startswith("!"):
                raise ValueError(f"negated commands are not supported: {line!r}")
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", c):
                if c not in aliases:
                    raise ValueError(f"unknown Cmnd_Alias {c} in {line!r}")
                cmds += aliases[c]
            elif c.startswith("/"):
                cmds.append(c)
            else:
                raise ValueError(f"unsupported command {c!r} in {line!r}")
        specs.append((m["user"], "root", bool(tags) and tags[-1] == "NOPASSWD", cmds))
    if len({s[0] for s in specs}) != 1 or len({s[2] for s in specs}) != 1:
        raise ValueError("the rule must name exactly one user, with one password tag")
    return {
        "user": specs[0][0],
        "runas": "root",
        "nopasswd": specs[0][2],
        "commands": [c for s in specs for c in s[3]],
    }


def node_rule(
    rule: dict[str, Any],
    host: str,
    dev_prefix: str,
    nvidia_smi: str,
    log: str,
    programs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return the rule file of one node: the rule's paths rewritten to the node's own.

    ``programs``: the node's own runtime programs (name -> path); a pattern's ``/usr/bin/NAME``
    (the path the README's rule gives them) becomes the node's path.
    """
    own = {"nvidia-smi": nvidia_smi, **(programs or {})}
    dev = _escape(dev_prefix)
    cmds = []
    for c in rule["commands"]:
        words = re.split(r"(?<!\\)([ \t]+)", c.strip(), maxsplit=1)  # path, space, arguments
        path, name = words[0], words[0].removeprefix("/usr/bin/")
        if path.startswith("/usr/bin/") and name in own:
            path = _escape(own[name])
        cmds.append(path + "".join(words[1:]).replace("/dev/nvidia", dev))
    return {**rule, "commands": cmds, "host": host, "nvidia_smi": nvidia_smi,
            "programs": own, "log": log}  # fmt: skip


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    cur = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            cur += line[:-1] + " "
            continue
        line = (cur + line).strip()
        cur = ""
        if line and not line.startswith("#"):
            out.append(line)
    if cur.strip():
        out.append(cur.strip())
    return out


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts = [""]
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            parts[-1] += text[i : i + 2]
            i += 2
            continue
        if ch == sep:
            parts.append("")
        else:
            parts[-1] += ch
        i += 1
    return parts


def _escape(literal: str) -> str:
    """Quote a literal path for a sudoers command pattern."""
    return "".join("\\" + ch if ch in '*?[]\\ \t,:=!"' else ch for ch in literal)


# ---- matching --------------------------------------------------------------------------------


def glob_regex(pattern: str, pathname: bool) -> re.Pattern[str]:
    """Translate an fnmatch(3) pattern; ``pathname``: ``*``, ``?`` and classes never match ``/``."""
    any_char = "[^/]" if pathname else "."
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "\\" and i < n:
            out.append(re.escape(pattern[i]))
            i += 1
        elif ch == "*":
            out.append(any_char + "*")
        elif ch == "?":
            out.append(any_char)
        elif ch == "[":
            cls, end = _class(pattern, i, pathname)
            if cls is None:
                out.append(re.escape("["))
            else:
                out.append(cls)
                i = end
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def _class(pattern: str, i: int, pathname: bool) -> tuple[str | None, int]:
    """Translate the class that starts after the ``[`` at ``i - 1``; None if it is not one."""
    n = len(pattern)
    neg = i < n and pattern[i] in "!^"
    if neg:
        i += 1
    items: list[str] = []
    first = True
    while i < n and (first or pattern[i] != "]"):
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            ch = pattern[i + 1]
            i += 1
        i += 1
        first = False
        if i + 1 < n and pattern[i] == "-" and pattern[i + 1] != "]":
            hi = pattern[i + 1]
            i += 2
            if hi == "\\" and i < n:
                hi = pattern[i]
                i += 1
            items.append(f"{re.escape(ch)}-{re.escape(hi)}")
        else:
            items.append(re.escape(ch))
    if i >= n:
        return None, 0
    body = "".join(items)
    if neg:
        return f"[^{body}{'/' if pathname else ''}]", i + 1
    return (f"(?!/)[{body}]" if pathname else f"[{body}]"), i + 1


def _literal(pattern: str) -> str | None:
    """Return the unescaped ``pattern`` if it has no wildcard, else None."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        if ch in _WILD:
            return None
        out.append(ch)
        i += 1
    return "".join(out)


def _split_pattern(pattern: str) -> tuple[str, str | None]:
    """Split a command pattern into its path and its arguments (None: any arguments)."""
    words = [w for w in re.split(r"(?<!\\)[ \t]+", pattern.strip()) if w]
    if not words:
        raise ValueError("empty command pattern")
    if len(words) == 1:
        return words[0], None
    return words[0], " ".join(words[1:])


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def command_matches(pattern: str, path: str, args: list[str]) -> bool:
    """Tell whether sudoers' command ``pattern`` allows running ``path`` with ``args``."""
    ppath, pargs = _split_pattern(pattern)
    lit = _literal(ppath)
    if lit is None:
        if not glob_regex(ppath, pathname=True).fullmatch(path):
            return False
    elif lit != path and not (
        os.path.basename(lit) == os.path.basename(path) and _same_file(lit, path)
    ):
        return False
    if pargs is None:
        return True
    if pargs == '""':
        return not args
    return glob_regex(pargs, pathname=False).fullmatch(" ".join(args)) is not None


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
    env.update({
        "PATH": ":".join(SECURE_PATH),
        "HOME": "/root",
        "USER": runas,
        "LOGNAME": runas,
        "SHELL": "/bin/sh",
        "SUDO_COMMAND": line,
        "SUDO_USER": user,
        "SUDO_UID": str(os.getuid()),
        "SUDO_GID": str(os.getgid()),
    })  # fmt: skip
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], sys.argv[1]))
