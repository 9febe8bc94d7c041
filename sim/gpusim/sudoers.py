"""The sudoers rule of a simulated sudo node: the README's block parsed, rewritten per node,
and sudoers' command matching.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` with ``sudo.py``, the
stand-in that checks every ``sudo -n`` call against the rule file that ``node_rule`` makes.

Only the small subset of sudoers the README's rule uses is read (``Cmnd_Alias`` lines and one
user spec); anything else is a ``ValueError`` rather than a guess. Command patterns match as
sudo 1.9 matches them: in the path, ``*`` and ``?`` stop at ``/``; in the arguments, ``*``
matches anything, spaces and slashes included; ``[0-9]`` is a class; a pattern without
arguments allows any, ``""`` none. An exact path also matches the same file reached through
another name (``/bin/kill`` for ``/usr/bin/kill``), as sudo compares device and inode.
"""

from __future__ import annotations

import os
import re
from typing import Any

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
    return {
        **rule,
        "commands": cmds,
        "host": host,
        "nvidia_smi": nvidia_smi,
        "programs": own,
        "log": log,
    }


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
