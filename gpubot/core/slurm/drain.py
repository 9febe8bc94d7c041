"""Draining and resuming a Slurm node: the argv gpubot runs, the reason it writes, and how it
reads the node's state first (pure: the service runs these over the node's transport).

``scontrol update NodeName=N State=DRAIN Reason=R`` overwrites the reason of a node drained
already, and ``State=RESUME`` of a node in service exits 1 ("Invalid node state specified"), so
the state is read first and an action with nothing to change is not sent. The state is read
with ``scontrol -o show node N`` (one line: ``... State=IDLE+DRAIN ... Reason=R [user@time]``):
Debian's 22.05 ``scontrol`` has no ``--json``.

Slurm keeps one line of reason; gpubot's names gpubot, the reason given, who approved and the
audit record, printable and capped (``slurm_reason``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubot.core.slurm import SCHEDULERS
from gpubot.core.text import cut, one_line

SLURM = SCHEDULERS[0]  # the scheduler a node's settings name for a Slurm node
SCONTROL = "scontrol"
MAX_SLURM_REASON = 200  # characters of the reason written into Slurm
MAX_NAME = 40  # characters of the approver's name in it
# Flags and states under which Slurm schedules nothing new on a node: RESUME returns it.
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
DRAINS = frozenset({"DRAIN", "DRAINED", "DRAINING"})
REASON_HEAD = "gpubot audit #"  # how every reason gpubot writes into Slurm begins
_STAMP = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")  # " [root@2026-12-06T17:54:23]"


@dataclass(frozen=True)
class NodeDrainState:
    """A node's state as ``scontrol -o show node`` says it."""

    name: str  # Slurm's NodeName
    states: tuple[str, ...]  # base state then flags, upper case: ("IDLE", "DRAIN")
    reason: str | None  # as set, without its ``[user@time]`` stamp; None: none

    @property
    def draining(self) -> bool:
        """Whether the node is drained or draining (the DRAIN flag)."""
        return bool(DRAINS & set(self.states))

    @property
    def in_service(self) -> bool:
        """Whether Slurm may schedule on the node (no drain, down or fail)."""
        return not OUT_OF_SERVICE & set(self.states)

    @property
    def gpubots(self) -> bool:
        """Whether gpubot took the node out of service: drained (not down, not failed) with a
        reason ``slurm_reason`` wrote."""
        only_drain = not (OUT_OF_SERVICE - DRAINS) & set(self.states)
        return self.draining and only_drain and (self.reason or "").startswith(REASON_HEAD)

    def shown(self) -> str:
        """Return the state as Slurm writes it (``IDLE+DRAIN``)."""
        return "+".join(self.states) or "?"


@dataclass(frozen=True)
class NodeChange:
    """A change of a node's state in Slurm that someone asked for: a drain (with its reason)
    or a resume. It is what an approval request holds when it is not a reset plan."""

    node: str  # gpubot's name of the node (its Slurm NodeName comes from its settings)
    drain: bool  # False: a resume
    reason: str | None = None  # a drain's reason as asked (None: none given)

    @property
    def verb(self) -> str:
        """Return ``drain`` or ``resume``."""
        return "drain" if self.drain else "resume"

    @property
    def state(self) -> str:
        """Return the state it asks Slurm for (``DRAIN``, ``RESUME``), as stored."""
        return "DRAIN" if self.drain else "RESUME"

    def to_dict(self) -> dict[str, object]:
        """Return its stored form (``from_dict`` reads it back)."""
        return {"node": self.node, "state": self.state, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: object) -> NodeChange:
        """Read its stored form; ``ValueError`` if it is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"a node change is a mapping, not {type(data).__name__}")
        node, state, reason = data.get("node"), data.get("state"), data.get("reason")
        if not isinstance(node, str) or not node:
            raise ValueError("a node change names no node")
        if state not in ("DRAIN", "RESUME"):
            raise ValueError(f"a node change's state is DRAIN or RESUME, not {state!r}")
        if reason is not None and not isinstance(reason, str):
            raise ValueError("a node change's reason is text")
        return cls(node, state == "DRAIN", reason)


def show_argv(slurm_node: str) -> list[str]:
    """Return the argv that reads a node's state in one line."""
    return [SCONTROL, "-o", "show", "node", slurm_node]


def update_argv(slurm_node: str, *, drain: bool, reason: str | None = None) -> list[str]:
    """Return the argv that drains (with ``reason``: Slurm requires one) or resumes a node."""
    argv = [SCONTROL, "update", f"NodeName={slurm_node}"]
    if not drain:
        return [*argv, "State=RESUME"]
    if not reason:
        raise ValueError("Slurm drains a node only with a reason")
    return [*argv, "State=DRAIN", f"Reason={reason}"]


def slurm_reason(reason: str | None, approver: str, action_id: int) -> str:
    """Return gpubot's reason for Slurm: ``gpubot audit #ID, approved by NAME: REASON``, one
    printable line of at most ``MAX_SLURM_REASON`` characters (the reason is what is cut).

    gpubot's own facts come first: the requester's free text, last, cannot pass itself off as
    them (``xid 79, approved by olga, audit #5`` stays the reason's words)."""
    name = cut(_printable(approver) or "?", MAX_NAME)
    head = f"{REASON_HEAD}{action_id}, approved by {name}: "
    given = _printable(reason or "") or "no reason given"
    return head + cut(given, MAX_SLURM_REASON - len(head))


def _printable(text: str) -> str:
    """Return ``text`` as one line of printable characters, spaces collapsed."""
    return " ".join(one_line(" ".join(text.split())).split())


def parse_show(text: str, slurm_node: str) -> NodeDrainState:
    """Parse ``scontrol -o show node N``'s one line; ``ValueError`` if it is not that node's."""
    line = next((x for x in text.splitlines() if x.startswith("NodeName=")), None)
    if line is None:
        raise ValueError(f"no NodeName= line in scontrol's answer: {cut(one_line(text), 120)!r}")
    words = line.split()
    name = words[0].removeprefix("NodeName=")
    if name != slurm_node:
        raise ValueError(f"scontrol answered for node {name!r}, not {slurm_node!r}")
    state = next((w.removeprefix("State=") for w in words if w.startswith("State=")), None)
    if state is None:
        raise ValueError(f"scontrol gave no State= for node {slurm_node!r}")
    states = tuple(s.strip("*~#!%$@^-").upper() for s in state.split("+") if s)
    reason: str | None = None
    at = line.find(" Reason=")
    if at >= 0:
        reason = _STAMP.sub("", line[at + len(" Reason=") :]).strip() or None
    return NodeDrainState(name, states, None if reason is None else one_line(reason))


def one_line_error(text: str, most: int = 200) -> str:
    """Return a command's error output as one printable line (Slurm's own words)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return cut(one_line(" ".join(lines)), most) or "(no output)"
