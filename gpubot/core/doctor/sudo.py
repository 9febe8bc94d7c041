"""Does ``sudo -n -l`` on a node list exactly the README's sudoers rule, no more, no less?

sudo 1.8/1.9 print one ``(RUNAS) TAGS: CMD, CMD, …`` entry per rule, wrapped onto
more-indented lines past the width. More than the rule is any command outside it, a wildcard
path, ``ALL``, or a run-as other than root; less is a command the settings use that is missing
or asks for a password.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.core.runtimes import RUNTIMES

DEV = "{dev}"  # the node's device prefix, written as a sudoers pattern


def _split(command: str) -> tuple[str, str]:
    """``docker inspect *`` -> (program, arguments)."""
    program, _, args = command.partition(" ")
    return program, args


# (alias, program name, arguments): the README's rule, each runtime's lines from its own value.
# A program's path may be any absolute path without wildcards (fuser lives in /usr/bin or
# /usr/sbin, nvidia-smi where the driver is).
README_RULE: tuple[tuple[str, str, str], ...] = (
    ("GPUBOT_FUSER", "fuser", f"-v {DEV}[0-9]*"),
    ("GPUBOT_KILL", "kill", "-s TERM [0-9]*"),
    ("GPUBOT_KILL", "kill", "-s KILL [0-9]*"),
    ("GPUBOT_RESET", "nvidia-smi", "--gpu-reset -i [0-9]*"),
    ("GPUBOT_RESET", "nvidia-smi", "-pm 0 -i [0-9]*"),
    ("GPUBOT_RESET", "nvidia-smi", "-pm 1 -i [0-9]*"),
    *(("GPUBOT_INSPECT", *_split(r.lookup.sudo)) for r in RUNTIMES if r.lookup and r.lookup.sudo),
    *(("GPUBOT_STOP", *_split(r.sudo_stop)) for r in RUNTIMES if r.sudo_stop),
    # Only on Slurm nodes with sudo = true: /gpu drain and resume (core.doctor.slurm checks them).
    # sudoers escapes "=" in arguments, and `sudo -l` prints them so (sudo 1.9.13, checked)
    ("GPUBOT_DRAIN", "scontrol", r"update NodeName\=* State\=DRAIN Reason\=*"),
    ("GPUBOT_DRAIN", "scontrol", r"update NodeName\=* State\=RESUME"),
)
_ENTRY = re.compile(r"\((?P<runas>[^)]*)\)\s*(?P<rest>.*)")
_TAGS = re.compile(r"((?:[A-Z_]+:\s*)+)")
_SPECIAL = '*?[]\\ \t,:=!"'


@dataclass(frozen=True)
class Grant:
    """One command ``sudo -l`` lists: who it runs as, whether without a password, the pattern."""

    runas: str
    nopasswd: bool
    command: str


def sudoers_escape(literal: str) -> str:
    """Quote a literal path as sudoers writes it in a command pattern."""
    return "".join("\\" + ch if ch in _SPECIAL else ch for ch in literal)


def parse_sudo_list(text: str) -> tuple[Grant, ...]:
    """Return the commands of ``sudo -n -l``'s "may run the following commands" part."""
    entries: list[str] = []
    inside = False
    for line in text.splitlines():
        if not line.strip():
            inside = inside and not entries
            continue
        if "may run the following commands" in line:
            inside = True
            continue
        if not inside:
            continue
        if not line.startswith((" ", "\t")):
            inside = False
        elif line.strip().startswith("(") or not entries:
            entries.append(line.strip())
        else:
            entries[-1] += " " + line.strip()  # sudo wraps a long entry onto indented lines
    grants: list[Grant] = []
    for entry in entries:
        m = _ENTRY.fullmatch(entry)
        if m is None:
            continue
        nopasswd = False
        for part in _split_commas(m["rest"]):
            tags = _TAGS.match(part)
            if tags:
                names = re.findall(r"[A-Z_]+", tags[1])
                if "NOPASSWD" in names:
                    nopasswd = True
                elif "PASSWD" in names:
                    nopasswd = False
                part = part[tags.end() :]
            if part.strip():
                grants.append(Grant(m["runas"].strip(), nopasswd, " ".join(part.split())))
    return tuple(grants)


def _split_commas(text: str) -> list[str]:
    """Split a sudoers command list at unescaped commas."""
    # An escape pair is kept whole, so only a bare comma becomes a newline (an entry has none).
    marked = re.sub(r"\\.|,", lambda m: "\n" if m[0] == "," else m[0], text, flags=re.S)
    return [p.strip() for p in marked.split("\n")]


def _split_command(command: str) -> tuple[str, str | None]:
    """Split a pattern into its path and its arguments (None: any arguments)."""
    words = [w for w in re.split(r"(?<!\\)\s+", command.strip()) if w]
    if len(words) <= 1:
        return (words[0] if words else ""), None
    return words[0], " ".join(words[1:])


@dataclass(frozen=True)
class SudoNeeds:
    """What a node's settings use of the rule."""

    dev_prefix: str = "/dev/nvidia"
    toggle_persistence: bool = False
    runtimes: tuple[str, ...] = ()
    stop_workloads: bool = False

    def required(self) -> list[tuple[str, str]]:
        """Return the (program, arguments) pairs gpubot runs with ``sudo -n`` on this node."""
        need = [("kill", "-s TERM [0-9]*"), ("kill", "-s KILL [0-9]*")]
        need.append(("nvidia-smi", "--gpu-reset -i [0-9]*"))
        if self.toggle_persistence:
            need += [("nvidia-smi", "-pm 0 -i [0-9]*"), ("nvidia-smi", "-pm 1 -i [0-9]*")]
        listed = [r for t in self.runtimes for r in RUNTIMES if r.lookup and r.lookup.tool == t]
        need += [_split(r.lookup.sudo) for r in listed if r.lookup and r.lookup.sudo]
        if self.stop_workloads:
            need += [_split(r.sudo_stop) for r in listed if r.sudo_stop]
        return need

    def allowed(self) -> set[tuple[str, str]]:
        """Return every (program, arguments) pair of the README's rule, for this node."""
        dev = sudoers_escape(self.dev_prefix)
        return {(prog, args.replace(DEV, dev)) for _, prog, args in README_RULE}


def judge_grants(grants: Sequence[Grant], needs: SudoNeeds) -> tuple[list[str], list[str]]:
    """Return (what is wider than the README's rule, what the settings need and lack)."""
    allowed = needs.allowed()
    wide: list[str] = []
    have: set[tuple[str, str]] = set()
    for g in grants:
        path, args = _split_command(g.command)
        prog = posixpath.basename(path)
        if g.command == "ALL" or path == "ALL":
            wide.append("ALL (every command)")
        elif not path.startswith("/") or any(ch in path for ch in "*?["):
            wide.append(f"{g.command} (a path with wildcards)")
        elif args is None:
            wide.append(f"{g.command} (any arguments)")
        elif (prog, args) not in allowed:
            wide.append(g.command)
        elif g.runas not in ("root", "root : root"):
            wide.append(f"{g.command} as ({g.runas})")
        elif g.nopasswd:
            have.add((prog, args))
    missing = [f"{p} {a}" for p, a in needs.required() if (p, a) not in have]
    dev = sudoers_escape(needs.dev_prefix)
    if ("fuser", f"-v {dev}[0-9]*") not in have:
        missing.insert(0, f"fuser -v {dev}[0-9]*")
    return wide, missing


def aliases_of(missing: Sequence[str]) -> list[str]:
    """Return the README's ``Cmnd_Alias`` names that hold the ``missing`` commands."""
    out: list[str] = []
    for text in missing:
        prog, _, args = text.partition(" ")
        for alias, p, a in README_RULE:
            if p == prog and a.split(" ", 1)[0] == args.split(" ", 1)[0] and alias not in out:
                out.append(alias)
                break
    return out or ["the missing commands"]


def sudo_check(area: str, text: str | None, exit_status: int | None, needs: SudoNeeds) -> Check:
    """Check ``sudo -n -l``'s answer (``text`` None: sudo is not installed)."""
    name = "sudo rule"
    fix_rule = "install the README's sudoers rule (visudo -f /etc/sudoers.d/gpubot)"
    if text is None:
        return failed(area, name, "sudo not found (the node has sudo = true)", "install sudo")
    if exit_status == 124:
        return failed(area, name, "sudo -n -l did not answer in time", "check sudo on the node")
    grants = parse_sudo_list(text)
    if exit_status != 0 or not grants:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
        return failed(area, name, f"sudo -n -l lists no rule: {first[:120]}", fix_rule)
    wide, missing = judge_grants(grants, needs)
    if wide:
        return failed(
            area,
            name,
            f"too wide: also allows {'; '.join(wide)[:300]}",
            "remove what the README's rule does not list from /etc/sudoers.d/gpubot",
        )
    if missing:
        return failed(
            area,
            name,
            f"too narrow: no NOPASSWD rule for {'; '.join(missing)[:300]}",
            f"add {', '.join(aliases_of(missing))} as the README's rule has them "
            "(visudo -f /etc/sudoers.d/gpubot)",
        )
    return passed(area, name, f"{len(grants)} commands, all from the README's rule")
