"""Read what Slurm says about a node, from the JSON of any version (pure functions, no I/O).

Sources: ``scontrol show job|node --json``, ``squeue --json`` and slurmrestd's
``/slurm/v0.0.NN/jobs``, ``/nodes``, ``/node/NAME``. Shapes by data_parser version (SchedMD/slurm
``src/plugins/openapi/v0.0.38/{jobs,nodes}.c`` at slurm-22-05-9-1, ``src/plugins/data_parser/``;
recorded answers in ``tests/corpus/slurm/``):

- v0.0.38 (22.05): plain numbers (``null`` for NO_VAL/INFINITE), ``"job_state": "RUNNING"``,
  node ``"state": "idle"`` (lower case, base only) with ``"state_flags": ["DRAIN"]``.
- v0.0.39 (23.02): many numbers become ``{"set", "infinite", "number"}``; times stay plain.
- v0.0.40+ (23.11+): every number is the set/number object, ``job_state`` and node ``state``
  are lists (base state then flags), ``job_resources.nodes`` becomes an object (v0.0.41+).

``gres_detail`` holds one string per allocated node, built by ``gres_stepmgr_job_build_details``
(``src/stepmgr/gres_stepmgr.c``): ``NAME[:TYPE]:COUNT(IDX:BITS)`` items joined by ``,``, where
BITS is ``bit_fmt`` of the node's GRES bitmap (``0-1,3``; empty when COUNT is 0). Shared GRES
print ``mps:100(0)`` or ``shard:2(1/4,1/4)``; a count without a bitmap prints ``gpu(CNT:2)``. The
i-th string belongs to the i-th host of the job's ``nodes`` hostlist: Slurm itself maps them so
(``hostlist_nth(nodes, i)`` there, and ``scontrol``'s ``src/scontrol/info_job.c``).

A job whose GPU indices on the node cannot be read beyond doubt keeps ``gpu_idx=()`` with
``gpu_unknown=True``: an index is never guessed. Every parser treats its input as hostile:
a malformed record is skipped; only a document that is not of the expected shape at all raises
``SlurmParseError`` (one line).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpubot.core import text
from gpubot.core.slurm import JobAlloc, NodeState

# The job states in which a job holds its nodes' resources (``job_state_string`` of Slurm's
# src/common/slurm_protocol_defs.c names a flag first: COMPLETING, CONFIGURING, STOPPED ...).
HOLDING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"})
_FLAG_FIRST = ("COMPLETING", "CONFIGURING", "STOPPED")

# slurmrestd plugin versions this parser has read real or source-documented answers of.
KNOWN_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")

MAX_HOSTS = 65536  # a hostlist expanding to more is refused (no memory blow-up)
MAX_GRES_IDX = 1023  # gres.conf(5): File= Count is limited to 1024 per node
MAX_TIME = 253402300799.0  # 9999-12-31: later "times" are sentinels, not times
_MAX_ID = 2**32 - 1
_NAME_MOST = 256
_REASON_MOST = 1024

_STATE = re.compile(r"[A-Z][A-Z_]{0,31}")
_HOST_ITEM = re.compile(r"(?:[^\s\[\],]+|\[[0-9,-]+\])+")
_HOST_TOKEN = re.compile(r"[^\[\]]+|\[[^\[\]]*\]")
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
_BITS = re.compile(r"(?:[0-9]{1,5}(?:-[0-9]{1,5})?(?:,[0-9]{1,5}(?:-[0-9]{1,5})?)*)?")
_GPU_HEAD = re.compile(r"gpu(?::([^:()\s,]{1,64}))?(?::([0-9]{1,6}))?")
_VERSION_PATH = re.compile(r"/slurm/(v0\.0\.([0-9]{1,3}))/")


class SlurmParseError(ValueError):
    """Slurm's answer is not of the expected shape at all (the message is one line)."""

    def __init__(self, message: str) -> None:
        super().__init__(text.one_line(text.cut(message, 300)))


# --- small readers -------------------------------------------------------------------------


def _number(value: Any) -> int | None:
    """An integer from a plain number or v0.0.39+'s ``{"set", "infinite", "number"}``; None when
    unset, infinite, null or not a number (a bool is not one)."""
    if isinstance(value, Mapping):
        if value.get("set") is not True or value.get("infinite") is not False:
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _time(value: Any) -> float | None:
    n = _number(value)
    return float(n) if n is not None and 0 < n <= MAX_TIME else None


def _id(value: Any) -> int | None:
    n = _number(value)
    return n if n is not None and 0 < n <= _MAX_ID else None


def _text(value: Any, most: int = _NAME_MOST) -> str | None:
    """Someone's text, cut and printable-escaped; None unless a non-empty string."""
    if not isinstance(value, str) or not value:
        return None
    return text.one_line(text.cut(value, most))


def _states(value: Any) -> list[str] | None:
    """Upper-case state names from a string or a list of strings; None if not readable."""
    raw = [value] if isinstance(value, str) else value
    if not isinstance(raw, list) or not raw:
        return None
    out: list[str] = []
    for s in raw:
        if not isinstance(s, str) or not _STATE.fullmatch(s.upper()):
            return None
        if s.upper() not in out:
            out.append(s.upper())
    return out


def _records(doc: Any, key: str) -> list[Any]:
    if not isinstance(doc, Mapping):
        raise SlurmParseError(f"Slurm's answer is not a JSON object (no {key!r} list)")
    records = doc.get(key)
    if not isinstance(records, list):
        raise SlurmParseError(f"Slurm's answer has no {key!r} list{_errors(doc)}")
    return records


def _errors(doc: Mapping[str, Any]) -> str:
    """``: <first error>`` from slurmrestd's ``errors`` list, or nothing."""
    errors = doc.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], Mapping):
        said = errors[0].get("description") or errors[0].get("error")
        if isinstance(said, str) and said:
            return ": " + text.cut(said, 200)
    return ""


# --- hostlists -----------------------------------------------------------------------------


def expand_hostlist(hostlist: str, most: int = MAX_HOSTS) -> list[str]:
    """Expand a Slurm hostlist (``node[1-3,7],gpu-a[01-02]``) into host names, in order.

    A range keeps its lower bound's width (``[08-10]``: ``08 09 10``), as Slurm's hostlist.c
    does; several bracket groups in one name expand left to right (``r[1-2]n[1-2]``: ``r1n1 r1n2
    r2n1 r2n2``). An empty string is no host. Raises ``SlurmParseError`` for a malformed list or
    one of more than ``most`` hosts.
    """
    if not isinstance(hostlist, str):
        raise SlurmParseError("a hostlist is not a string")
    out: list[str] = []
    for item in _split_top(hostlist, "[", "]") if hostlist else ():
        if not item.isprintable() or not _HOST_ITEM.fullmatch(item):
            raise SlurmParseError(f"bad name {text.cut(item, 40)!r} in a hostlist")
        pieces = [
            _expand_ranges(tok[1:-1], hostlist, most) if tok.startswith("[") else [tok]
            for tok in _HOST_TOKEN.findall(item)
        ]
        if len(out) + math.prod(len(p) for p in pieces) > most:
            raise SlurmParseError(f"hostlist {text.cut(hostlist, 80)!r} names too many hosts")
        out.extend("".join(p) for p in itertools.product(*pieces))
    return out


def _expand_ranges(ranges: str, hostlist: str, most: int) -> list[str]:
    out: list[str] = []
    for r in ranges.split(","):
        m = _RANGE.fullmatch(r)
        if m is None:
            raise SlurmParseError(f"bad range {r!r} in hostlist {text.cut(hostlist, 80)!r}")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo or len(out) + hi - lo + 1 > most:
            raise SlurmParseError(f"bad range {r!r} in hostlist {text.cut(hostlist, 80)!r}")
        width = len(m[1])
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def _split_top(s: str, opening: str, closing: str) -> list[str]:
    """Split ``s`` at the commas outside ``opening``...``closing``; raise if they do not pair."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"unbalanced {opening}{closing} in {text.cut(s, 80)!r}")
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    if depth:
        raise SlurmParseError(f"unbalanced {opening}{closing} in {text.cut(s, 80)!r}")
    parts.append(s[start:])
    return parts


# --- gres_detail ---------------------------------------------------------------------------


_ON_GPUS = ("mps", "shard")  # GRES that are shares of GPUs: their holders run on a GPU


def gpu_indices(detail: str) -> tuple[int, ...] | None:
    """The gpu GRES indices of one node's ``gres_detail`` string, sorted; None when they cannot be
        read beyond doubt (``IDX:N/A``, ``CNT:``, a count that differs from the indices, a cut or
        unknown form, and a share of a GPU: ``mps``, ``shard``). Other GRES (``nic`` ...) are left
    out."""
    if not isinstance(detail, str) or not detail.isprintable():
        return None
    if not detail:
        return ()
    try:
        items = _split_top(detail, "(", ")")
    except SlurmParseError:
        return None
    found: set[int] = set()
    for item in items:
        head, paren, rest = item.partition("(")
        if not paren or not rest.endswith(")"):
            return None
        if head.partition(":")[0] in _ON_GPUS:
            return None  # a share of a GPU (its own index form): which GPU is not read here
        if head != "gpu" and not head.startswith("gpu:"):
            continue  # another GRES: its own business
        m = _GPU_HEAD.fullmatch(head)
        inner = rest[:-1]
        if m is None or not inner.startswith("IDX:"):
            return None
        bits = inner[4:]
        if not _BITS.fullmatch(bits):
            return None  # N/A, a cut ("..."), anything else
        idx = _bit_list(bits)
        count = m[2]
        if m[1] is not None and m[2] is None and m[1].isdigit():
            count = m[1]  # "gpu:2(IDX:0-1)": the one field is the count
        if idx is None or (count is not None and int(count) != len(idx)):
            return None
        found.update(idx)
    return tuple(sorted(found))


def _bit_list(bits: str) -> list[int] | None:
    out: list[int] = []
    for part in bits.split(",") if bits else ():
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or b > MAX_GRES_IDX:
            return None
        out.extend(range(a, b + 1))
    return out if len(set(out)) == len(out) else None


# --- jobs ----------------------------------------------------------------------------------


def jobs_on(doc: Mapping[str, Any], node: str) -> tuple[JobAlloc, ...]:
    """The jobs holding resources on ``node`` (running, suspended, completing, configuring,
    stopped), with their GPU GRES indices there, in the document's order.

    ``doc`` is the JSON of ``scontrol show job --json``, ``squeue --json`` or slurmrestd's
    ``GET /slurm/v0.0.NN/jobs`` (``{"jobs": [...]}``). A record that cannot be read (no valid id,
    no state, a hostlist that does not parse) is skipped; one job id seen twice keeps its first
    record. Raises ``SlurmParseError`` when ``doc`` has no ``jobs`` list, or when it is empty
    and slurmrestd reported an error (an empty answer must not read as "no jobs").
    """
    records = _records(doc, "jobs")
    if not records and _errors(doc):
        raise SlurmParseError(f"Slurm reported an error{_errors(doc)}")
    out: list[JobAlloc] = []
    seen: set[str] = set()
    for rec in records:
        job = _job_on(rec, node) if isinstance(rec, Mapping) else None
        if job is not None and job.job_id not in seen:
            seen.add(job.job_id)
            out.append(job)
    return tuple(out)


def _job_on(rec: Mapping[str, Any], node: str) -> JobAlloc | None:
    job_id = _job_id(rec)
    states = _states(rec.get("job_state"))
    if job_id is None or states is None:
        return None
    state = next((s for s in _FLAG_FIRST if s in states), states[0])
    if state not in HOLDING:
        return None
    nodes = rec.get("nodes")
    try:
        hosts = expand_hostlist(nodes) if isinstance(nodes, str) else None
    except SlurmParseError:
        return None
    if hosts is None or node not in hosts:
        return None
    gpus = _gpus_on(rec, hosts, node)
    user = _text(rec.get("user_name"), 64)
    if user is None:
        uid = _number(rec.get("user_id"))
        user = str(uid) if uid is not None and 0 <= uid <= _MAX_ID else "?"
    limit_unset = rec.get("time_limit") is None or _number(rec.get("time_limit")) is None
    own = _own_id(rec)
    return JobAlloc(
        own_id=None if own == job_id else own,
        job_id=job_id,
        user=user,
        name=_text(rec.get("name")) or "",
        state=state,
        gpu_idx=gpus or (),
        account=_text(rec.get("account"), 64),
        start=_time(rec.get("start_time")),
        end=None if limit_unset else _time(rec.get("end_time")),
        gpu_unknown=gpus is None,
    )


def _own_id(rec: Mapping[str, Any]) -> str | None:
    """The record's own numeric job id (an array task's and a het component's are their own)."""
    own = rec.get("job_id")
    job = _id(own) if not isinstance(own, str) else (int(own) if own.isdigit() else None)
    return str(job) if job is not None and 0 < job <= _MAX_ID else None


def _job_id(rec: Mapping[str, Any]) -> str | None:
    """``123``, ``123_4`` (an array task), ``123+1`` (a heterogeneous job's component)."""
    own = _own_id(rec)
    if own is None:
        return None
    job = int(own)
    array, task = _id(rec.get("array_job_id")), _number(rec.get("array_task_id"))
    if array is not None and task is not None and 0 <= task < _MAX_ID:
        return f"{array}_{task}"
    het, offset = _id(rec.get("het_job_id")), _number(rec.get("het_job_offset"))
    if het is not None and offset is not None and 0 <= offset < _MAX_ID:
        return f"{het}+{offset}"
    return str(job)


def _gpus_on(rec: Mapping[str, Any], hosts: list[str], node: str) -> tuple[int, ...] | None:
    """The job's gpu indices on ``node``; None when they cannot be read beyond doubt."""
    order = _allocation_order(rec.get("job_resources"))
    if order is not None and order != hosts:
        return None  # the two node orders Slurm gave disagree: which entry is ours?
    details = rec.get("gres_detail")
    if details is None or details == []:
        return None if _asks_gpus(rec) else ()
    if not isinstance(details, list) or len(details) != len(hosts) or hosts.count(node) != 1:
        return None
    return gpu_indices(details[hosts.index(node)])


def _allocation_order(res: Any) -> list[str] | None:
    """The node names of ``job_resources`` in allocation order, when the JSON lists them
    (v0.0.39/40 ``allocated_nodes[].nodename``, v0.0.41+ ``nodes.allocation[].name``)."""
    if not isinstance(res, Mapping):
        return None
    nodes = res.get("nodes")
    if isinstance(nodes, Mapping):
        listed, key = nodes.get("allocation"), "name"
    else:
        listed, key = res.get("allocated_nodes"), "nodename"
    if not isinstance(listed, list) or not listed:
        return None
    names = [n.get(key) if isinstance(n, Mapping) else None for n in listed]
    return names if all(isinstance(n, str) for n in names) else None  # type: ignore[return-value]


def _asks_gpus(rec: Mapping[str, Any]) -> bool:
    """Whether the job's TRES name gpus though no ``gres_detail`` says which."""
    for key in ("tres_alloc_str", "tres_per_node", "tres_per_job", "tres_per_task", "gres"):
        v = rec.get(key)
        if isinstance(v, str) and "gpu" in v:
            return True
    return False


# --- nodes ---------------------------------------------------------------------------------


def node_state(doc: Mapping[str, Any], node: str) -> NodeState | None:
    """``node`` as Slurm holds it, from ``scontrol show node --json`` or slurmrestd's
    ``/nodes`` or ``/node/NAME``; None when Slurm has no readable record of it (slurmrestd's
    answer for an unknown node has no ``nodes`` list, only the error "Failure to query node
    NAME"). Two records of the node raise ``SlurmParseError``."""
    if isinstance(doc, Mapping) and "nodes" not in doc and unknown_node(doc, node):
        return None
    found = [
        r
        for r in _records(doc, "nodes")
        if isinstance(r, Mapping) and isinstance(r.get("name"), str) and r["name"] == node
    ]
    if len(found) > 1:
        raise SlurmParseError(f"Slurm's answer holds {len(found)} records of node {node!r}")
    if not found:
        return None
    rec = found[0]
    states = _states(rec.get("state"))
    if states is None:
        return None
    flags = rec.get("state_flags")  # v0.0.38: base state apart from its flags
    if flags is not None:
        extra = _states(flags) if flags != [] else []
        if extra is None:
            return None
        states += [f for f in extra if f not in states]
    return NodeState(
        name=text.one_line(node),
        states=tuple(states),
        reason=_text(rec.get("reason"), _REASON_MOST),
        reason_by=_text(rec.get("reason_set_by_user"), 64),
        reason_at=_time(rec.get("reason_changed_at")),
    )


def unknown_node(doc: Mapping[str, Any], node: str) -> bool:
    errors = doc.get("errors")
    if not isinstance(errors, list):
        return False
    return any(
        isinstance(e, Mapping) and e.get("description") == f"Failure to query node {node}"
        for e in errors
    )


# --- OpenAPI discovery ---------------------------------------------------------------------


def openapi_versions(doc: Mapping[str, Any]) -> list[str]:
    """The ``slurm`` plugin versions slurmrestd serves (``v0.0.40`` ...), oldest first, from its
    OpenAPI document (``/openapi/v3``, ``/openapi``)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("paths"), Mapping):
        raise SlurmParseError("slurmrestd's OpenAPI document has no 'paths' object")
    found: dict[str, int] = {}
    for path in doc["paths"]:
        m = _VERSION_PATH.match(path) if isinstance(path, str) else None
        if m is not None:
            found[m[1]] = int(m[2])
    return sorted(found, key=found.__getitem__)


def pick_version(versions: Sequence[str]) -> str | None:
    """The highest of ``versions`` this parser knows; None if it knows none of them."""
    known = [v for v in versions if v in KNOWN_VERSIONS]
    return max(known, key=KNOWN_VERSIONS.index) if known else None
