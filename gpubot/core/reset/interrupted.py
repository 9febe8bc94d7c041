"""Interrupted work: one line per action with an intent but no outcome, not yet reviewed.

Every front end that touches a node says these lines, so a deployment that only runs the CLI
still hears that a reset was cut off (SIGKILL, a reboot, a lost terminal).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from gpubot.core.text import code
from gpubot.core.timefmt import iso


class Unfinished(Protocol):
    """What the lines need of an action summary."""

    @property
    def id(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def node(self) -> str | None: ...

    @property
    def actor(self) -> str: ...

    @property
    def command(self) -> str: ...

    @property
    def started_at(self) -> datetime: ...


def show_command(action_id: int) -> str:
    return f"gpubot audit show {action_id}"


def interrupted_line(a: Unfinished) -> str:
    """Return what was cut off, by whom, when, and where to read what it did."""
    when = a.started_at.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{a.kind or 'action'} #{a.id} on {a.node or '-'} by {a.actor} at {when} UTC "
        f"never finished: {code(show_command(a.id))}"
    )


def interrupted_lines(actions: Iterable[Unfinished]) -> list[str]:
    """Return one line per action, then how to stop seeing them (none: no line at all)."""
    found = list(actions)
    if not found:
        return []
    ids = " ".join(str(a.id) for a in found[:5])
    return [
        *(interrupted_line(a) for a in found),
        f"  check the node, then mark each reviewed: {code(f'gpubot audit review {ids}')}",
    ]


def interrupted_dict(a: Unfinished) -> dict[str, Any]:
    return {
        "id": a.id,
        "kind": a.kind,
        "node": a.node,
        "actor": a.actor,
        "command": a.command,
        "started_at": iso(a.started_at, timespec="seconds"),
        "line": interrupted_line(a),
        "show": show_command(a.id),
        "review": f"gpubot audit review {a.id}",
    }
