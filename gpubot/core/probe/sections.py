"""The section grammar of the probe's output: ``MARK kind args...`` lines, each with a body.

Sections must come exactly as the script writes them, in order and once each; anything else is
a ``ParseError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpubot.core.models import CommandResult, DeviceHolder, NodeConfig, ProcInfo
from gpubot.core.probe.fields import NUM, parse_fuser, parse_proc_lines
from gpubot.core.probe.nvsmi import first_meaningful_line
from gpubot.core.probe.script import MARK
from gpubot.errors import ParseError, ProbeError

PROBE_GRAMMAR = re.compile(
    r"probe (?:fatal end|stuck end"
    r"|gpus-err gpus (?:end|apps-err apps (?:end|minors fuser view procs end))"
    r"|minors fuser view procs end)"
)
PROC_GRAMMAR = re.compile(r"procs end")
MARKER = re.compile("\n" + re.escape(MARK) + " ([^\n]*)\n")
_BUS_DIR = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass
class Sections:
    """The sections of one script's output, checked against the script's grammar."""

    what: str
    items: list[tuple[str, list[str], str]]
    node: str = "?"

    @property
    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.items]

    @classmethod
    def parse(
        cls,
        text: str,
        grammar: re.Pattern[str],
        what: str,
        *,
        result: CommandResult | None = None,
        node: str = "?",
    ) -> Sections:
        """Split ``text`` at its markers and check their order; with ``result``, output with no
        marker at all is the probe failing to run."""
        text = "\n" + text
        matches = list(MARKER.finditer(text))
        if not matches:
            if result is not None and result.exit_status == 127 and "bash" in result.stderr:
                raise ProbeError(node, "bash not found on the node (the probe is a bash script)")
            if result is not None and result.exit_status != 0:
                why = first_meaningful_line(result.stderr) or first_meaningful_line(result.stdout)
                raise ProbeError(node, f"probe failed (exit {result.exit_status}): {why}")
            raise ParseError(f"{what} (no section marker)", first_meaningful_line(text))
        if text[: matches[0].start()].strip():
            raise ParseError(f"{what} (text before the first section)", text[:80].strip())
        items: list[tuple[str, list[str], str]] = []
        for m, nxt in zip(matches, [*matches[1:], None], strict=True):
            words = m[1].split(" ")
            body = text[m.end() : nxt.start() if nxt else len(text)]
            items.append((words[0], words[1:], body))
        if len(items) > 2 and items[-2][0] == "over" and items[-1][0] == "end":
            raise _over(node, items[-2][1])
        kinds = " ".join(k for k, _, _ in items)
        if not grammar.fullmatch(kinds):
            if items[-1][0] != "end":
                raise ParseError(f"{what} (cut short)", first_meaningful_line(text[-300:]))
            raise ParseError(f"{what} (sections out of order or repeated)", kinds[:200])
        if items[-1][2].strip():
            raise ParseError(f"{what} (text after the end)", items[-1][2].strip()[:80])
        return cls(what=what, items=items, node=node)

    def get(self, kind: str) -> tuple[list[str], str] | None:
        """Return the arguments and body of the ``kind`` section, None if there is none."""
        return next(((a, b) for k, a, b in self.items if k == kind), None)

    def args(self, kind: str, n: int) -> list[str]:
        """Return the ``n`` arguments of a section that has no body."""
        found = self.get(kind)
        if found is None or len(found[0]) != n or found[1].strip():
            raise ParseError(f"{self.what} ({kind} section)", " ".join(found[0]) if found else "")
        return found[0]

    def body(self, kind: str) -> str:
        """Return the body of the ``kind`` section, which has no arguments."""
        found = self.get(kind)
        if found is None or found[0]:
            raise ParseError(f"{self.what} ({kind} section)", "")
        return found[1]

    def status(self, kind: str) -> tuple[int, str]:
        """Return the exit status a section carries and its body."""
        found = self.get(kind)
        if found is None:
            raise ParseError(f"{self.what} (no {kind} section)", "")
        args, body = found
        if len(args) != 1 or not NUM.fullmatch(args[0]):
            raise ParseError(f"{self.what} ({kind} status)", " ".join(args))
        return int(args[0]), body

    def smi_answer(self, kind: str) -> tuple[int, str, str]:
        """Return nvidia-smi's exit status, standard output and standard error for ``kind``."""
        status, body = self.status(kind)
        return status, body, self.body(f"{kind}-err")

    def view(self) -> tuple[str | None, int | None]:
        """Return /proc's ``hidepid`` option (None when not set) and the uid the probe ran as."""
        hp, uid = self.args("view", 2)
        if hp != "-" and not re.fullmatch(r"[0-9a-z]{1,16}", hp):
            raise ParseError(f"{self.what} (view section)", hp)
        if uid != "-" and not NUM.fullmatch(uid):
            raise ParseError(f"{self.what} (view section)", uid)
        return (None if hp in ("-", "0", "off") else hp), (None if uid == "-" else int(uid))

    def fuser_ran(self) -> bool:
        """Whether the probe asked fuser (a status whose memory adds up does not: ``fuser -``)."""
        found = self.get("fuser")
        if found is not None and found[0] == ["-"]:
            if found[1].strip():
                raise ParseError(f"{self.what} (fuser section not asked, with a body)", "")
            return False
        return True

    def fuser(self, node: NodeConfig) -> tuple[tuple[DeviceHolder, ...], int]:
        """Return fuser's holders and how many processes it could not look into."""
        if not self.fuser_ran():
            return (), 0
        status, body = self.status("fuser")
        unseen = 0
        lines = []
        for line in body.splitlines():
            if line.startswith("~unseen "):  # the fuser filter's count, last
                n = line.split(" ", 1)[1]
                if not NUM.fullmatch(n):
                    raise ParseError(f"{self.what} (fuser unseen count)", line)
                unseen = int(n)
            else:
                lines.append(line)
        body = "\n".join(lines)
        if status == 127:
            raise ProbeError(node.name, "fuser (psmisc) not found on the node")
        for line in body.splitlines():
            if line.startswith("sudo:") or line.startswith("Sorry, user"):
                raise ProbeError(node.name, f"sudo -n fuser refused: {line.strip()[:200]}")
        if status not in (0, 1):
            why = first_meaningful_line(body)
            raise ProbeError(node.name, f"fuser failed (exit {status}): {why}")
        return parse_fuser(body), unseen

    def minors(self) -> dict[str, int | None]:
        """Return each GPU's device minor by bus id (``0000:18:00.0``) from the driver's files."""
        out: dict[str, int | None] = {}
        for line in self.body("minors").split("\n"):
            if not line:
                continue
            words = line.split(" ")
            if len(words) != 2 or not _BUS_DIR.fullmatch(words[0]) or words[0] in out:
                raise ParseError(f"{self.what} (device minor line)", line[:200])
            if not (NUM.fullmatch(words[1]) or words[1] == "-"):
                raise ParseError(f"{self.what} (device minor line)", line[:200])
            out[words[0]] = int(words[1]) if words[1] != "-" else None
        return out

    def procs(self, pids: Sequence[int]) -> dict[int, ProcInfo]:
        """Return the ``procs`` section, parsed, for ``pids`` (those still there)."""
        return parse_proc_lines(self.body("procs"), pids, self.what)


_STAGES = {
    "stuck": "looking for a stuck nvidia-smi",
    "fuser": "reading fuser's table",
    "procs": "reading /proc",
}


def _over(node: str, args: list[str]) -> ProbeError:
    """Say that the probe stopped at its time budget: what the node holds is unknown."""
    if len(args) != 2 or not NUM.fullmatch(args[0]) or args[1] not in _STAGES:
        raise ParseError("probe output (over section)", " ".join(args)[:200])
    return ProbeError(
        node,
        f"probe stopped at its time budget ({int(args[0]) / 1000:g}s) while {_STAGES[args[1]]}: "
        "too much to read in time, so what this node's GPUs hold is unknown",
    )
