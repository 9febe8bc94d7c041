"""The ``/gpu …`` language (``USAGE``): one pure parser shared by Slack, the console and the CLI.

Every word is validated here; nothing of it reaches a shell. Everything after the first
``because`` is a reset's reason, kept apart from the words that say what to do, so it can never
change what is signalled; it is made one line and capped. A reason that reads like a reset's
options (``because hung pid 4242``) is refused: those words would be dropped from the targets,
and the reset would be wider than the one meant.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from gpubot.core import durations
from gpubot.core import maint as maint_commands
from gpubot.core.claims import commands as claim_commands
from gpubot.core.names import LINUX_USER, NODE_NAME
from gpubot.core.text import cut
from gpubot.errors import UsageError

MAX_INPUT = 300  # characters of one command line
MAX_GPU_INDEX = 255
MAX_PID = 4_194_304  # Linux's largest pid_max (2^22)
MAX_GRACE_S = 600.0
DEFAULT_AUDIT = 10
MAX_AUDIT = 100
MAX_LIST = 16  # GPUs or PIDs in one request
MAX_REASON = 200  # characters kept of a reason

_INT = re.compile(r"[0-9]{1,9}")
_BECAUSE = re.compile(r"(?:^|\s)because(?:\s|$)", re.IGNORECASE)
# A reset's option and a value it would take: ``pid 42``, ``gpu=1,2``, ``--user alice``
# (``user`` in its written-out forms only: "the user asked" is a reason).
_OPTION = re.compile(
    r"(?:^|\s)(?:(?:--)?(?:gpus?|pids?|grace)(?:=|\s+)[0-9]|(?:--user\s+|user=)[a-z_])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Status:
    """``status``: nodes, groups or ``all`` (empty: all)."""

    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reset:
    """``reset``: free GPUs of one node."""

    node: str
    gpus: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()
    user: str | None = None
    grace_s: float | None = None
    reason: str | None = None  # what follows ``because``: shown and audited, never signalled


@dataclass(frozen=True)
class GpuReset:
    """``gpu-reset``: ``nvidia-smi --gpu-reset`` one idle GPU."""

    node: str
    gpu: int


@dataclass(frozen=True)
class Diag:
    """``diag``: DCGM's diagnostic (``dcgmi diag``) on one GPU, quick (-r 1) or medium (-r 2)."""

    node: str
    gpu: int
    level: str = "quick"


@dataclass(frozen=True)
class Drain:
    """``drain``: ask Slurm to schedule nothing new on a node (``resume``: back to service)."""

    node: str
    reason: str | None = None  # what follows ``because``: written into Slurm's reason


@dataclass(frozen=True)
class Resume:
    """``resume``: return a node Slurm holds drained (or down) to service."""

    node: str


@dataclass(frozen=True)
class Sweep:
    """``sweep``: look for zombies and orphaned memory now."""


@dataclass(frozen=True)
class Audit:
    """``audit``: the latest actions, of one node or all."""

    node: str | None = None
    limit: int = DEFAULT_AUDIT


@dataclass(frozen=True)
class Report:
    """``report``: GPU-hours over the last ``since`` (a duration), by user, team or node."""

    since: str = "7d"
    by: str = "user"


@dataclass(frozen=True)
class Help:
    """``help``: the usage of all commands or one."""

    topic: str | None = None


@dataclass(frozen=True)
class Decide:
    """``approve ID`` / ``deny ID`` (the console's buttons)."""

    approval_id: int
    approve: bool


Command = (
    Status
    | Reset
    | GpuReset
    | Diag
    | Drain
    | Resume
    | Sweep
    | Audit
    | Report
    | Help
    | Decide
    | claim_commands.ClaimCommand
    | maint_commands.MaintCommand
)

USAGE: dict[str, str] = {
    "status": "/gpu status [NODE|GROUP|all]  — per-GPU memory, utilisation and processes",
    "reset": "/gpu reset NODE [gpu N[,M]] [pid P] [user NAME] [grace DURATION] [because REASON]"
    "  — free GPUs safely (TERM, grace, KILL, verify); killing someone else's job needs "
    "on-call approval",
    "gpu-reset": "/gpu gpu-reset NODE gpu N  — nvidia-smi --gpu-reset an idle GPU whose memory "
    "leaked",
    "diag": "/gpu diag NODE gpu N [quick|medium]  — run DCGM's diagnostic (dcgmi diag -r 1|2) "
    "on one GPU, e.g. before giving it back after a gpu-reset; audited",
    "drain": "/gpu drain NODE [because REASON]  — drain a Slurm node (nothing new is scheduled "
    "there); needs on-call approval unless you are on call; audited, the reason names the "
    "audit record",
    "resume": "/gpu resume NODE  — return a drained Slurm node to service; needs on-call "
    "approval unless you are on call",
    "sweep": "/gpu sweep  — look for zombie processes and orphaned GPU memory now",
    "maint": maint_commands.USAGE,
    "audit": "/gpu audit [NODE] [N]  — the last N actions (default 10, at most 100)",
    "report": "/gpu report [7d] [by user|team|node]  — GPU-hours held busy, idle and claimed "
    "but unused",
    "help": "/gpu help [COMMAND]  — this text",
    **claim_commands.USAGE,
}
DECIDE_USAGE = {
    "approve": "approve ID  — approve a pending forced kill (console)",
    "deny": "deny ID  — deny a pending forced kill (console)",
}
_VERBS = (*USAGE, *DECIDE_USAGE)
_ALIASES = {"gpureset": "gpu-reset", "gpu_reset": "gpu-reset", "st": "status", "?": "help"}
_RESET_OPTS = {
    "gpu": "gpu",
    "gpus": "gpu",
    "pid": "pid",
    "pids": "pid",
    "user": "user",
    "grace": "grace",
}


def help_text(topic: str | None = None, *, decisions: bool = False) -> str:
    """Return the usage of every command, or of ``topic``."""
    table = {**USAGE, **(DECIDE_USAGE if decisions else {})}
    if topic is not None:
        key = _ALIASES.get(topic.lower(), topic.lower())
        if key in table:
            return table[key]
    return "\n".join(table.values())


def parse(text: str, *, decisions: bool = False) -> Command:
    """Parse one ``/gpu …`` line, or raise ``UsageError``; ``decisions``: the console's too."""
    _check_input(text)
    words = text.split()
    if words and words[0].lower() == "/gpu":
        words = words[1:]
    if words and words[0].lower() == "claim":  # a claim's note is free text: "because" too
        return claim_commands.parse("claim", words[1:])
    line, reason = split_reason(" ".join(words))
    if reason == "":
        raise UsageError("nothing follows 'because': say why, or leave 'because' out")
    words = line.split()
    if not words and reason is None:
        return Help()
    if not words:
        raise UsageError("a reason needs a command: reset NODE … because REASON")
    verb = words[0].lower()
    verb = _ALIASES.get(verb, verb)
    args = words[1:]
    if reason is not None and verb not in ("reset", "drain", "maint"):
        raise UsageError(
            f"'because …' gives a reason to reset, drain or maint only, not to {_show(words[0])}"
        )
    if verb == "reset":
        if reason is not None and (opt := option_in(reason)) is not None:
            raise UsageError(
                f"{_show(opt)} follows 'because', so it would be read as the reason and not "
                "narrow the reset: put the options before 'because'"
            )
        return replace(_reset(args), reason=reason)
    on_nodes = _on_nodes(verb, args, reason)
    if on_nodes is not None:
        return on_nodes
    if verb == "sweep":
        _no_more(args, "sweep")
        return Sweep()
    if verb == "audit":
        return _audit(args)
    if verb == "report":
        return _report(args)
    if verb == "help":
        _no_more(args[1:], "help")
        return Help(args[0].lower() if args else None)
    if verb in claim_commands.USAGE:
        return claim_commands.parse(verb, args)
    if verb in DECIDE_USAGE and decisions:
        if len(args) != 1:
            raise UsageError(f"usage: {DECIDE_USAGE[verb]}")
        return Decide(_int(args[0], "approval id", 1, 10**9), verb == "approve")
    if verb in DECIDE_USAGE:
        raise UsageError(f"{verb!r}: use the Approve / Deny buttons on the request")
    known = [v for v in _VERBS if decisions or v not in DECIDE_USAGE]
    close = difflib.get_close_matches(verb, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown command {_show(words[0])}{hint}; try: {', '.join(USAGE)}")


def _on_nodes(verb: str, args: list[str], reason: str | None) -> Command | None:
    """Parse the verbs that name nodes (status, gpu-reset, diag, drain, resume, maint); None:
    another verb."""
    if verb == "status":
        return Status(tuple(_name(w, "node or group") for w in args))
    if verb in ("gpu-reset", "diag"):
        return GpuReset(*_node_gpu(args, verb)) if verb == "gpu-reset" else _diag(args)
    if verb == "drain":
        return Drain(_one_node(args, "drain"), reason)
    if verb == "resume":
        return Resume(_one_node(args, "resume"))
    if verb == "maint":
        return maint_commands.parse(args, reason)
    return None


def parse_gpus(text: str) -> tuple[int, ...]:
    return _int_list(text, "GPU number", 0, MAX_GPU_INDEX)


def parse_grace(text: str) -> float:
    """Parse a grace period: a duration or bare seconds, from 0 to ``MAX_GRACE_S``."""
    try:
        value = durations.parse(text, positive=False, bare=True)
    except durations.DurationError:
        value = -1.0
    if not 0 <= value <= MAX_GRACE_S:
        raise UsageError(
            f"bad grace {_show(text)}: expected a duration from 0s to "
            f"{durations.format(MAX_GRACE_S)} (e.g. 30s, 1m30s)"
        )
    return value


def _reset(args: list[str]) -> Reset:
    if not args:
        raise UsageError(f"reset needs a node; usage: {USAGE['reset']}")
    node = _name(args[0], "node")
    opts = _options(args[1:], _RESET_OPTS, f"reset {node}")
    user = opts.get("user")
    if user is not None and not LINUX_USER.fullmatch(user):
        raise UsageError(f"bad user name {_show(user)}")
    return Reset(
        node=node,
        gpus=parse_gpus(opts["gpu"]) if "gpu" in opts else (),
        pids=_int_list(opts["pid"], "pid", 2, MAX_PID) if "pid" in opts else (),
        user=user,
        grace_s=parse_grace(opts["grace"]) if "grace" in opts else None,
    )


def _node_gpu(args: list[str], verb: str) -> tuple[str, int]:
    """Return the node and the one GPU of ``verb NODE gpu N`` (``gpu-reset``, ``diag``)."""
    if not args:
        raise UsageError(f"{verb} needs a node; usage: {USAGE[verb]}")
    node = _name(args[0], "node")
    opts = _options(args[1:], {"gpu": "gpu"}, f"{verb} {node}")
    if "gpu" not in opts:
        raise UsageError(f"{verb} needs one GPU; usage: {USAGE[verb]}")
    gpus = parse_gpus(opts["gpu"])
    if len(gpus) != 1:
        raise UsageError(f"{verb} takes exactly one GPU")
    return node, gpus[0]


def _diag(args: list[str]) -> Diag:
    level = "quick"
    if len(args) > 1 and args[-1].lower() in ("quick", "medium"):
        args, level = args[:-1], args[-1].lower()
    return Diag(*_node_gpu(args, "diag"), level)


def _one_node(args: list[str], verb: str) -> str:
    """Return the one node ``verb`` takes (``drain``, ``resume``)."""
    if not args:
        raise UsageError(f"{verb} needs a node; usage: {USAGE[verb]}")
    node = _name(args[0], "node")
    _no_more(args[1:], verb)
    return node


def _audit(args: list[str]) -> Audit:
    node: str | None = None
    limit = DEFAULT_AUDIT
    if args and not _INT.fullmatch(args[0]):
        node = _name(args.pop(0), "node")
    if args:
        limit = _int(args.pop(0), "count", 1, MAX_AUDIT)
    _no_more(args, "audit")
    return Audit(node, limit)


def _report(args: list[str]) -> Report:
    rest = [a.lower() for a in args]
    since = "7d"
    if rest and rest[0] != "by":
        since = rest.pop(0)
        try:
            durations.parse(since)
        except durations.DurationError as exc:
            raise UsageError(f"bad period {_show(since)}: {exc.expected}") from None
    by = "user"
    if rest[:1] == ["by"]:
        if len(rest) < 2 or rest[1] not in ("user", "team", "node"):
            raise UsageError(f"usage: {USAGE['report']}")
        by, rest = rest[1], rest[2:]
    _no_more(rest, "report")
    return Report(since, by)


def _options(args: list[str], names: dict[str, str], context: str) -> dict[str, str]:
    """Read ``key value`` / ``key=value`` / ``--key value`` pairs; each key once."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        key, eq, value = word.removeprefix("--").partition("=")
        canon = names.get(key.lower())
        if canon is None:
            expected = ", ".join(sorted(set(names.values())))
            raise UsageError(f"unexpected {_show(word)} after {context!r} (expected {expected})")
        if not eq:
            if i + 1 >= len(args):
                raise UsageError(f"{key.lower()} needs a value")
            value = args[i + 1]
            i += 1
        if canon in out:
            raise UsageError(f"{canon} given twice")
        if not value:
            raise UsageError(f"{key.lower()} needs a value")
        out[canon] = value
        i += 1
    return out


def _int_list(text: str, what: str, low: int, high: int) -> tuple[int, ...]:
    """Parse ``N[,M…]`` into sorted unique whole numbers from ``low`` to ``high``."""
    parts = text.split(",")
    if len(parts) > MAX_LIST:
        raise UsageError(f"too many values for {what} ({len(parts)}, at most {MAX_LIST})")
    return tuple(sorted({_int(p, what, low, high) for p in parts}))


def _int(text: str, what: str, low: int, high: int) -> int:
    if not _INT.fullmatch(text) or not low <= int(text) <= high:
        raise UsageError(f"bad {what} {_show(text)}: expected a whole number {low}-{high}")
    return int(text)


def _name(text: str, what: str) -> str:
    if not NODE_NAME.fullmatch(text):
        raise UsageError(f"bad {what} name {_show(text)}: letters, digits, '.', '_' and '-' only")
    return text


def _no_more(args: list[str], verb: str) -> None:
    if args:
        raise UsageError(f"unexpected {_show(args[0])} after {verb!r}; usage: {USAGE[verb]}")


def _show(word: str) -> str:
    """Quote a piece of user input for an error message, shortened."""
    return repr(word if len(word) <= 40 else word[:37] + "...")


def _check_input(text: str) -> None:
    """Refuse a line too long or holding a control character, before anything reads it."""
    if len(text) > MAX_INPUT:
        raise UsageError(f"input too long ({len(text)} characters, at most {MAX_INPUT})")
    bad = next((c for c in text if not c.isprintable() and c not in " \t\n\r"), None)
    if bad is not None:
        raise UsageError(f"input contains a control character ({ord(bad):#04x})")


def clean_reason(text: str | None) -> str | None:
    """Return ``text`` as one line of at most ``MAX_REASON`` characters (None if empty)."""
    if text is None:
        return None
    one = " ".join(text.split())
    if not one:
        return None
    return cut(one, MAX_REASON)


def split_reason(text: str) -> tuple[str, str | None]:
    """Split a command line at the first word ``because``: the command, and the reason
    (None without ``because``; ``""`` when nothing follows it)."""
    m = _BECAUSE.search(text)
    if m is None:
        return text, None
    return text[: m.start()], clean_reason(text[m.end() :]) or ""


def option_in(reason: str) -> str | None:
    """Return the first words of ``reason`` that read like a reset's option (None: none)."""
    m = _OPTION.search(reason)
    if m is None:
        return None
    word, *rest = reason[m.start() :].split()
    value = rest[0] if rest and "=" not in word else ""
    return f"{word} {value}".strip()
