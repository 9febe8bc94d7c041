"""Attribution on the node: one ``logger -t gpubot`` line for every action gpubot takes there.

An admin reading a node's journal after a SIGKILL, a ``gpu-reset``, a persistence toggle, a
workload stop or a drain should see who did it and why: the action and its targets, who asked,
who approved (and the approval request), and the audit record's number. The line is written in
the same exec as the action (``LOGGER_SH``, a shell function the action's script calls, or
``logged_argv`` around a plain command), never by an extra round trip.

The line is composed here from validated parts; every part a person or a node user controls (a
process or workload name, a Slack display name, a drain reason) is ``quoted``: one printable
line in double quotes with ``"`` and ``\\`` escaped, so it cannot pass for gpubot's own words.
The line reaches ``logger`` as one argv word, never through a shell string.

``logger`` failing (absent, refused by the journal, stuck: cut after ``LOGGER_TIMEOUT_S``) never
stops or changes the action: the script goes on, and prints one marker line ``logger STATUS
WORDS`` (its exit status and what it said, whitespace folded) that ``parse_marker`` reads, so
the audit records what the node said.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.core.text import cut, one_line

TAG = "gpubot"  # logger's -t: what `journalctl -t gpubot` finds
MAX_LINE = 900  # characters: util-linux logger's default --size is 1 KiB
MAX_QUOTED = 60  # characters of one quoted part
LOGGER_TIMEOUT_S = 2  # a logger stuck on a full journal socket is cut after this
MARKER = "logger"  # the first word of the line the scripts print about logger
NO_MARKER = -1  # exit status recorded when the node printed no marker line

# $1: the line (empty: log nothing, print nothing). Prints "logger STATUS WORDS".
LOGGER_SH = rf"""
gpubot_log() {{
  [ -n "$1" ] || return 0
  if command -v timeout >/dev/null 2>&1; then
    lo=$(timeout {LOGGER_TIMEOUT_S} logger -t {TAG} -- "$1" 2>&1 </dev/null); lr=$?
  else
    lo=$(logger -t {TAG} -- "$1" 2>&1 </dev/null); lr=$?
  fi
  case $- in *f*) lf= ;; *) lf=1; set -f ;; esac
  set -- $lo
  [ -z "$lf" ] || set +f
  printf '%s\n' "{MARKER} $lr $*"
}}
"""

# $1: the line, then the command: log, then exec the command (its exit status is the exec's).
LOGGED_SCRIPT = LOGGER_SH + 'm=$1; shift\ngpubot_log "$m"\nexec "$@"\n'
LOGGED_NAME = "gpubot-log"  # $0 of ``LOGGED_SCRIPT``


def quoted(text: str | None, most: int = MAX_QUOTED) -> str:
    """Return text a person or a node user controls as one quoted, printable, capped part."""
    if text is None:
        return "?"
    flat = one_line(text.replace("\\", "\\\\").replace('"', '\\"'))
    return '"' + cut(flat, most) + '"'


@dataclass(frozen=True)
class Attribution:
    """Who an action is for: the requester, the approver and request (if approved), the
    audit record's number."""

    actor_id: str
    actor_name: str | None
    action_id: int
    approver: str | None = None
    request_id: int | None = None
    requester: str | None = None  # who asked for an approved action (the approval's requester)

    @classmethod
    def of(
        cls,
        actor_id: str,
        actor_name: str | None,
        action_id: int,
        approval: Mapping[str, Any] | None = None,
    ) -> Attribution:
        """Return the attribution of an action, with its ``approval`` record if any
        (``approvals.approval_record``: id, requester_name, approver_name ...)."""
        if not approval:
            return cls(actor_id, actor_name, action_id)
        rid = approval.get("id")
        return cls(
            actor_id,
            actor_name,
            action_id,
            approver=_str(approval.get("approver_name") or approval.get("approver")),
            request_id=rid if isinstance(rid, int) else None,
            requester=_str(approval.get("requester_name") or approval.get("requester")),
        )

    def tail(self) -> str:
        """Return ``by "NAME" (ID), requested by ..., approved by ..., request #R, audit #N``."""
        who = quoted(self.actor_name or self.actor_id)
        if self.actor_name and self.actor_name != self.actor_id:
            who += f" ({quoted(self.actor_id)})"
        parts = [f"by {who}"]
        if self.requester is not None and self.requester not in (self.actor_id, self.actor_name):
            parts.append(f"requested by {quoted(self.requester)}")
        if self.approver is not None:
            parts.append(f"approved by {quoted(self.approver)}")
        if self.request_id is not None:
            parts.append(f"request #{int(self.request_id)}")
        parts.append(f"audit #{int(self.action_id)}")
        return ", ".join(parts)


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def line(kind: str, node: str, gpus: Sequence[int], what: str, who: Attribution) -> str:
    """Return the line: ``KIND NODE gpu 1,2: WHAT by ..., audit #N``, at most ``MAX_LINE``
    characters (``what`` is what is cut; the attribution is kept whole)."""
    where = f"{kind} {one_line(node)}"
    if gpus:
        where += f" gpu {','.join(str(int(g)) for g in gpus)}"
    tail = " " + who.tail()
    room = MAX_LINE - len(where) - 2 - len(tail)
    return f"{where}: {cut(one_line(what), max(room, 20))}{tail}"[:MAX_LINE]


@dataclass(frozen=True)
class TargetName:
    """One process a signal goes to, as the line names it."""

    pid: int
    user: str | None
    name: str | None  # its command or comm: the user's choice


def signal_what(signal: str, targets: Sequence[TargetName]) -> str:
    """Return ``SIGTERM pid 4242 (alice "python3"), pid 4243 (...)``."""
    each = [f"pid {int(t.pid)} ({quoted(t.user, 32)} {quoted(t.name, 40)})" for t in targets]
    return f"{signal} " + ", ".join(each)


def logged_argv(text: str, argv: Sequence[str]) -> list[str]:
    """Return ``argv`` run after logging ``text`` in the same exec (``LOGGED_SCRIPT``)."""
    if "\0" in text or any("\0" in a for a in argv):
        raise ValueError("no NUL bytes in a logged command")
    return ["sh", "-c", LOGGED_SCRIPT, LOGGED_NAME, text, *argv]


@dataclass(frozen=True)
class NodeLog:
    """What the node said about the line: ``logger``'s exit status and words."""

    line: str
    exit_status: int  # NO_MARKER: the node printed no marker (nothing known)
    said: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"line": self.line, "ok": self.ok, "exit_status": self.exit_status}
        if self.exit_status == NO_MARKER:
            doc["said"] = (
                "the node printed no logger marker: whether the line was written is unknown"
            )
        elif self.said:
            doc["said"] = self.said
        return doc


def is_marker(text: str) -> bool:
    """Whether ``text`` (one line) is the scripts' marker line about logger."""
    parts = text.split(maxsplit=2)
    return len(parts) >= 2 and parts[0] == MARKER and parts[1].isdigit()


def parse_marker(text: str, logged: str) -> NodeLog:
    """Read the marker line ``logger STATUS WORDS`` (``is_marker``) about the line ``logged``."""
    parts = text.split(maxsplit=2)
    if not is_marker(text):
        return NodeLog(logged, NO_MARKER)
    said = cut(one_line(parts[2]), 300) if len(parts) > 2 else ""
    return NodeLog(logged, int(parts[1]), said)


def find_marker(stdout: str, logged: str) -> NodeLog:
    """Return what logger did, from the marker line anywhere in a script's answer."""
    found = next((x for x in stdout.splitlines() if is_marker(x)), None)
    return NodeLog(logged, NO_MARKER) if found is None else parse_marker(found, logged)


def split_logged(stdout: str, logged: str) -> tuple[NodeLog, str]:
    """Split the answer of a ``logged_argv`` exec: what logger did, and the command's stdout."""
    first, _, rest = stdout.partition("\n")
    if is_marker(first):
        return parse_marker(first, logged), rest
    return NodeLog(logged, NO_MARKER), stdout
