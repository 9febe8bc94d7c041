"""The claim and queue commands of the ``/gpu …`` language (``USAGE``), parsed purely."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubot.core import durations
from gpubot.core.names import NODE_NAME
from gpubot.errors import UsageError

MAX_COUNT = 16
MAX_GPU_INDEX = 255
MAX_NOTE = 200
_ID = re.compile(r"[0-9]{1,9}")  # ids, counts and GPU numbers


@dataclass(frozen=True)
class ClaimGpus:
    """``claim``: these GPUs (or ``count`` free ones) for ``duration_s``."""

    node: str
    gpus: tuple[int, ...]
    count: int
    duration_s: float
    note: str = ""


@dataclass(frozen=True)
class Extend:
    """``extend``: your claims (on a node, of some GPUs) by ``by_s`` more."""

    by_s: float
    node: str | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Release:
    """``release``: your claims (on a node, of some GPUs); all of them without a node."""

    node: str | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class ListClaims:
    """``claims``: of a node, of yours (``mine``), or all (the default)."""

    scope: str = "all"  # "all", "mine" or a node


@dataclass(frozen=True)
class WaitFor:
    """``wait``: a place in the queue for GPUs of a node."""

    node: str
    gpus: tuple[int, ...] = ()
    count: int = 1
    duration_s: float | None = None


@dataclass(frozen=True)
class Queue:
    """``queue``: who waits (for a node's GPUs)."""

    node: str | None = None


@dataclass(frozen=True)
class Leave:
    """``leave``: leave the queue (one place, or every place of yours)."""

    wait_id: int | None = None


@dataclass(frozen=True)
class Take:
    """``take ID``: claim what the queue holds for you."""

    wait_id: int


ClaimCommand = ClaimGpus | Extend | Release | ListClaims | WaitFor | Queue | Leave | Take

USAGE: dict[str, str] = {
    "claim": "/gpu claim NODE gpu N[,M] for 4h [NOTE]  or  /gpu claim NODE any COUNT for 4h  — "
    "claim GPUs; the answer gives CUDA_VISIBLE_DEVICES",
    "extend": "/gpu extend [NODE [gpu N]] by 2h  — make your claims last longer",
    "release": "/gpu release [NODE [gpu N]]  — end your claims (all of them without a node)",
    "claims": "/gpu claims [NODE|mine|all]  — who claims which GPUs, until when",
    "wait": "/gpu wait NODE [gpu N | any [COUNT]] [for 4h]  — queue for GPUs: a DM when free",
    "queue": "/gpu queue [NODE]  — who waits for which GPUs",
    "leave": "/gpu leave [ID]  — leave the queue",
    "take": "/gpu take ID  — claim the GPUs the queue holds for you",
}


def parse(verb: str, args: list[str]) -> ClaimCommand:
    """Parse the arguments of one claim or queue ``verb``; ``UsageError`` says why not."""
    if verb == "claim":
        return _claim(args)
    if verb == "extend":
        return _extend(args)
    if verb == "release":
        node, gpus, rest = _where(args, "release")
        _no_more(rest, "release")
        return Release(node, gpus)
    if verb == "claims":
        _no_more(args[1:], "claims")
        scope = args[0] if args else "all"
        return ListClaims(scope if scope in ("all", "mine") else _node(scope))
    if verb == "wait":
        return _wait(args)
    if verb == "queue":
        _no_more(args[1:], "queue")
        return Queue(_node(args[0]) if args else None)
    if verb == "leave":
        _no_more(args[1:], "leave")
        return Leave(_id(args[0]) if args else None)
    if verb == "take":
        if len(args) != 1:
            raise UsageError(f"usage: {USAGE['take']}")
        return Take(_id(args[0]))
    raise UsageError(f"unknown command {verb!r}")


def _duration(text: str) -> float:
    """Return a duration's seconds, or a ``UsageError`` quoting the word."""
    try:
        return durations.parse(text)
    except durations.DurationError as exc:
        raise UsageError(f"bad duration {_show(text)}: {exc.expected}") from None


def _claim(args: list[str]) -> ClaimGpus:
    if not args:
        raise UsageError(f"claim needs a node; usage: {USAGE['claim']}")
    node = _node(args[0])
    rest = args[1:]
    gpus: tuple[int, ...] = ()
    count = 0
    if len(rest) >= 2 and rest[0].lower() in ("gpu", "gpus"):
        gpus = _gpus(rest[1])
        count = len(gpus)
    elif len(rest) >= 2 and rest[0].lower() == "any":
        count = _count(rest[1])
    else:
        raise UsageError(f"claim {node}: say which GPUs; usage: {USAGE['claim']}")
    rest = rest[2:]
    if len(rest) < 2 or rest[0].lower() != "for":
        raise UsageError(f"claim {node}: say for how long (e.g. `for 4h`)")
    note = " ".join(rest[2:])
    if len(note) > MAX_NOTE:
        raise UsageError(f"the note is too long ({len(note)} characters, at most {MAX_NOTE})")
    return ClaimGpus(node, gpus, count, _duration(rest[1]), note)


def _extend(args: list[str]) -> Extend:
    if len(args) < 2 or args[-2].lower() != "by":
        raise UsageError(f"extend: say by how much (e.g. `by 2h`); usage: {USAGE['extend']}")
    node, gpus, rest = _where(args[:-2], "extend")
    _no_more(rest, "extend")
    return Extend(_duration(args[-1]), node, gpus)


def _wait(args: list[str]) -> WaitFor:
    if not args:
        raise UsageError(f"wait needs a node; usage: {USAGE['wait']}")
    node = _node(args[0])
    _, gpus, rest = _where(args, "wait")
    count = len(gpus) or 1
    if not gpus and rest and rest[0].lower() == "any":
        rest = rest[1:]
        if rest and rest[0].lower() != "for":
            count, rest = _count(rest[0]), rest[1:]
    duration = None
    if rest and rest[0].lower() == "for" and len(rest) >= 2:
        duration, rest = _duration(rest[1]), rest[2:]
    _no_more(rest, "wait")
    return WaitFor(node, gpus, count, duration)


def _where(args: list[str], verb: str) -> tuple[str | None, tuple[int, ...], list[str]]:
    if not args:
        return None, (), []
    node = _node(args[0])
    rest = args[1:]
    if rest and rest[0].lower() in ("gpu", "gpus"):
        if len(rest) < 2:
            raise UsageError(f"{verb}: gpu needs a value")
        return node, _gpus(rest[1]), rest[2:]
    return node, (), rest


def _gpus(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if len(parts) > MAX_COUNT:
        raise UsageError(f"too many GPUs ({len(parts)}, at most {MAX_COUNT})")
    for p in parts:
        if not _ID.fullmatch(p) or int(p) > MAX_GPU_INDEX:
            raise UsageError(
                f"bad GPU number {_show(p)}: expected a whole number 0-{MAX_GPU_INDEX}"
            )
    return tuple(sorted({int(p) for p in parts}))


def _count(text: str) -> int:
    if not _ID.fullmatch(text) or not 1 <= int(text) <= MAX_COUNT:
        raise UsageError(f"bad count {_show(text)}: expected a whole number 1-{MAX_COUNT}")
    return int(text)


def _id(text: str) -> int:
    if not _ID.fullmatch(text) or int(text) < 1:
        raise UsageError(f"bad id {_show(text)}: expected a whole number")
    return int(text)


def _node(text: str) -> str:
    if not NODE_NAME.fullmatch(text):
        raise UsageError(f"bad node name {_show(text)}: letters, digits, '.', '_' and '-' only")
    return text


def _no_more(args: list[str], verb: str) -> None:
    if args:
        raise UsageError(f"unexpected {_show(args[0])} after {verb!r}; usage: {USAGE[verb]}")


def _show(word: str) -> str:
    return repr(word if len(word) <= 40 else word[:37] + "...")
