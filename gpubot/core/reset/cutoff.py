"""What a reset that stopped on an error had already done, and what is known of each target.

A reset cut off after SIGTERM must not read like nothing happened: the person is told which pid
got which signal when and what was seen of it after; each targeted GPU is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.core.models import Outcome
from gpubot.core.reset.outcome import GpuResult

SHOWN = 6  # sent items named in the one-line message; the rest are counted (all are in JSON)


@dataclass(frozen=True)
class Sent:
    """One signal (or command) that went out to a node, and what is known of it after."""

    what: str  # "SIGTERM", "SIGKILL", or the command run
    at: str  # when it was recorded as sent (ISO time)
    after: str  # what is known since
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "signal": self.what, "at": self.at, "after": self.after}

    def text(self) -> str:
        """Return it in a few words: ``SIGTERM to pid 42 at 12:00:01Z (exited by 12:00:02Z)``."""
        to = "" if self.pid is None else f" to pid {self.pid}"
        return f"{self.what}{to} at {_clock(self.at)} ({self.after})"


def sent_items(steps: Sequence[Mapping[str, Any]], alive_at: Mapping[int, str]) -> list[Sent]:
    """Return every signal, stop command and ``nvidia-smi`` action that went out, in order."""
    exited: dict[int, str] = {}
    for s in steps:
        if s.get("kind") == "exited" and isinstance(s.get("pid"), int):
            exited[int(s["pid"])] = str(s.get("at", ""))
    out: list[Sent] = []
    for s in steps:
        kind = s.get("kind")
        at = str(s.get("at", ""))
        if kind == "signal" and s.get("result") == "sent" and isinstance(s.get("pid"), int):
            pid = int(s["pid"])
            out.append(Sent(str(s.get("signal")), at, _after(pid, at, exited, alive_at), pid))
        elif kind == "stop_workload" and s.get("result") == "running":
            out.append(Sent(str(s.get("command")), at, "its end was not recorded"))
        elif kind in ("gpu_reset", "persistence"):
            what = "nvidia-smi --gpu-reset" if kind == "gpu_reset" else "nvidia-smi -pm"
            out.append(Sent(what, at, f"exit status {s.get('exit_status')}"))
    return out


def _after(pid: int, at: str, exited: Mapping[int, str], alive_at: Mapping[int, str]) -> str:
    if pid in exited:
        return f"exited by {_clock(exited[pid])}"
    seen = alive_at.get(pid)
    if seen is not None and seen >= at:
        return f"still alive at {_clock(seen)}, not known since"
    return "not known since"


def unknown_gpus(gpus: Sequence[int], why: str) -> tuple[GpuResult, ...]:
    """Return each targeted GPU as ``unknown``: the reset stopped before it could tell (nor
    was its memory read)."""
    detail = f"{why}: the reset stopped before verifying this GPU; check the node"
    return tuple(GpuResult(g, Outcome.UNKNOWN, detail, None, None, None) for g in gpus)


def interrupted_message(node: str, error: str, sent: Sequence[Sent], gpus: Sequence[int]) -> str:
    """Return the one line a person reads: the error, what was already sent, GPUs unknown."""
    if not sent:
        return error
    named = "; ".join(s.text() for s in sent[:SHOWN])
    more = f"; and {len(sent) - SHOWN} more" if len(sent) > SHOWN else ""
    where = ", ".join(map(str, gpus)) or "-"
    return (
        f"{error}; already sent on {node}: {named}{more}; GPU {where}: unknown, "
        f"check with `gpubot status {node}`"
    )


def _clock(at: str) -> str:
    """Return the time of day of an ISO time (``12:00:01Z``), or the text as it is."""
    _, sep, rest = at.partition("T")
    if not sep:
        return at
    day, dot, _ = rest.partition(".")
    return f"{day}Z" if dot else rest
