"""Names for workloads: one bounded exec per runtime and probe, batched for all ids.

``enrich_argv`` builds the command, one of the ``parse_*`` functions reads its standard output
into ``Found`` records, and ``apply_enrichment`` puts a record on a ``Workload`` and decides its
owner. Everything a runtime prints about a workload is hostile: its owner chose the container's
name, image and labels, or the Slurm job's name, comment and paths. The JSON runtimes escape
that text themselves; ``scontrol`` does not, so its records are framed by markers the script
prints and checked for forgery. Any doubt drops the record: that workload's name is unknown,
never someone else's. Text lands here only through ``printable`` and a length cap.

Formats, as confirmed from the tools' sources and manuals:

- ``docker inspect --type container ID...`` (docs.docker.com/reference/cli/docker/inspect):
  one JSON array of the objects found, even when it exits 1 for an id it cannot find; ``Name``
  has a leading ``/``; ``Config.Labels`` may be null; ``HostConfig.RestartPolicy.Name``.
- ``podman inspect --type container ID...`` (podman-inspect(1), ``--type`` since 1.x,
  podman-container-inspect(1) example): the same array shape; ``Name`` without ``/``,
  ``ImageName``, ``Config.Labels`` (null in the manual's example).
- ``crictl inspect ID...`` (kubernetes-sigs/cri-tools ``cmd/crictl/container.go`` and
  ``util.go``): current versions print one ``{"status": ..., "info": ...}`` object for one id
  and a JSON array for several, and print nothing at all when any id is not found; older
  versions printed one object per id, concatenated. ``status`` is the CRI ``ContainerStatus``
  in protojson names: ``id``, ``metadata.name``, ``image.image``, ``labels``.
- ``scontrol show job ID`` (SchedMD/slurm ``src/scontrol/info_job.c`` ``_sprint_job_info``):
  ``JobId=N [ArrayJobId=.. ArrayTaskId=.. [ArrayTaskThrottle=..] | HetJobId=.. HetJobOffset=..]
  JobName=<rest of line>``, an optional ``   HetJobIdSet=`` line, then
  ``   UserId=NAME(UID) GroupId=NAME(GID) MCS_label=..``; records end with a blank line. An
  unknown uid prints as ``nobody(UID)`` (``src/common/uid.c``). One id may print several
  records (every task of an array, every component of a heterogeneous job).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpubot.core.names import as_root
from gpubot.core.probe_fields import printable
from gpubot.core.workload import Workload, WorkloadKind, decide_owner, valid_user

RUNTIMES = ("docker", "podman", "crictl", "slurm")
MAX_TEXT = 200  # characters of one name, image or label value kept
MAX_LABELS = 8  # labels kept on a workload, besides the owner label

_HEX64 = re.compile(r"[0-9a-f]{64}")
_JOB_ID = re.compile(r"[0-9]{1,10}")

# The markers frame each job's output: a job's owner can add marker lines (in a job name) but not
# remove the script's own, so any forged one makes the sequence differ and drops everything.
# Each job's output is printed only once scontrol has finished, so a hang prints nothing of it.
SLURM_SCRIPT = r"""for j do
  o=$(scontrol show job "$j")
  printf '\n@gpubot-job %s\n%s\n' "$j" "$o"
done
printf '\n@gpubot-end\n'"""


@dataclass(frozen=True)
class Found:
    """What one runtime said about one workload; every text is marked by ``printable``."""

    name: str | None = None  # container name, Slurm job name, Kubernetes container name
    image: str | None = None
    restart: str | None = None  # docker/podman restart policy
    labels: tuple[tuple[str, str], ...] = ()  # every label, sorted by key
    namespace: str | None = None  # Kubernetes
    pod: str | None = None
    pod_uid: str | None = None
    user: str | None = None  # Slurm: the job's user (a valid Linux name) ...
    uid: int | None = None  # ... and uid
    state: str | None = None  # Slurm: JobState


def enrich_argv(runtime: str, ids: Sequence[str], *, timeout_s: float, sudo: bool) -> list[str]:
    """Return the argv that asks ``runtime`` about ``ids`` in one exec, under coreutils timeout.

    Container ids must be 64 lowercase hex digits, Slurm job ids digits; anything else (or no
    id at all: ``crictl inspect`` with none inspects every container) raises ValueError.
    ``sudo`` runs the runtime's CLI as ``sudo -n``; never scontrol, which needs no root.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
    shape = _JOB_ID if runtime == "slurm" else _HEX64
    asked = list(dict.fromkeys(ids))
    if not asked:
        raise ValueError(f"{runtime}: no ids to ask about")
    for i in asked:
        if not isinstance(i, str) or not shape.fullmatch(i):
            raise ValueError(f"{runtime}: refusing id {str(i)[:80]!r}")
    head = ["timeout", "-k", "1", f"{timeout_s:.3f}".rstrip("0").rstrip(".")]
    if runtime == "slurm":
        return [*head, "sh", "-c", SLURM_SCRIPT, "gpubot-scontrol", *asked]
    if runtime == "crictl":
        return [*head, *as_root(["crictl", "inspect", *asked], sudo=sudo)]
    return [*head, *as_root([runtime, "inspect", "--type", "container", *asked], sudo=sudo)]


def enrich_target(w: Workload) -> tuple[str, str] | None:
    """Return ``(runtime, id)`` to look ``w`` up with, or None when no runtime can name it.

    A rootless container is left out: the system's daemon does not know it, and its owner
    comes from its user slice anyway. A container inside another is looked up by the outer
    one's id (the inner id was chosen inside the outer container: it could be another's).
    """
    outer = w.get("outer")
    if outer is not None:
        runtime = {"docker": "docker", "podman": "podman", "kubernetes": "crictl"}
        rt = runtime.get(w.get("outer_kind") or "")
        ok = rt is not None and not w.get("rootless") and _HEX64.fullmatch(outer)
        return (rt, outer) if ok and rt else None
    if w.kind in (WorkloadKind.DOCKER, WorkloadKind.PODMAN):
        ok = not w.get("rootless") and _HEX64.fullmatch(w.id)
        return (str(w.kind), w.id) if ok else None
    if w.kind is WorkloadKind.KUBERNETES:
        cid = w.get("container_id")
        return ("crictl", cid) if cid and _HEX64.fullmatch(cid) else None
    if w.kind is WorkloadKind.SLURM and _JOB_ID.fullmatch(w.id):
        return ("slurm", w.id)
    return None


# --- the JSON runtimes -------------------------------------------------------------------------


def parse_docker_inspect(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Read ``docker inspect`` output: a record for each asked id found exactly once."""
    return _by_id(_json_items(stdout), ids, lambda o: _str(o.get("Id")), _docker)


def parse_podman_inspect(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Read ``podman inspect`` output: a record for each asked id found exactly once."""
    return _by_id(_json_items(stdout), ids, lambda o: _str(o.get("Id")), _podman)


def parse_crictl_inspect(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Read ``crictl inspect`` output (one object, an array, or objects one after another)."""
    return _by_id(_json_items(stdout), ids, lambda o: _str(_at(o, "status", "id")), _crictl)


def _docker(o: dict[str, Any]) -> Found:
    name = _str(o.get("Name"))
    return Found(
        name=_text(name[1:] if name and name.startswith("/") else name),
        image=_text(_at(o, "Config", "Image")),
        restart=_text(_at(o, "HostConfig", "RestartPolicy", "Name")),
        labels=_labels(_at(o, "Config", "Labels")),
    )


def _podman(o: dict[str, Any]) -> Found:
    return Found(
        name=_text(o.get("Name")),
        image=_text(o.get("ImageName")) or _text(_at(o, "Config", "Image")),
        restart=_text(_at(o, "HostConfig", "RestartPolicy", "Name")),
        labels=_labels(_at(o, "Config", "Labels")),
    )


def _crictl(o: dict[str, Any]) -> Found:
    labels = _at(o, "status", "labels")
    lab: dict[str, Any] = labels if isinstance(labels, dict) else {}
    get = lab.get
    return Found(
        name=_text(_at(o, "status", "metadata", "name")),
        image=_text(_at(o, "status", "image", "image")) or _text(_at(o, "status", "imageRef")),
        labels=_labels(labels),
        namespace=_text(get("io.kubernetes.pod.namespace")),
        pod=_text(get("io.kubernetes.pod.name")),
        pod_uid=_text(get("io.kubernetes.pod.uid")),
    )


_WS = re.compile(r"\s*")


def _json_items(text: str) -> list[dict[str, Any]]:
    """Return the objects of every JSON value in ``text`` (arrays flattened); stop at junk."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i = 0
    while True:
        m = _WS.match(text, i)
        i = m.end() if m else i
        if i >= len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return out
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, dict):
                out.append(v)


def _by_id(
    items: list[dict[str, Any]],
    ids: Sequence[str],
    key: Callable[[dict[str, Any]], str | None],
    build: Callable[[dict[str, Any]], Found],
) -> dict[str, Found]:
    """Build a record for each asked id that exactly one item carries; drop ids seen twice."""
    asked = {i for i in ids if isinstance(i, str) and _HEX64.fullmatch(i)}
    seen: dict[str, list[dict[str, Any]]] = {}
    for o in items:
        k = key(o)
        if k is not None and k in asked:
            seen.setdefault(k, []).append(o)
    return {k: build(found[0]) for k, found in seen.items() if len(found) == 1}


def _at(o: object, *path: str) -> object:
    for p in path:
        if not isinstance(o, dict):
            return None
        o = o.get(p)
    return o


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _text(v: object) -> str | None:
    """Return ``v`` marked by ``printable`` and capped at MAX_TEXT; None unless a non-empty str."""
    if not isinstance(v, str) or not v:
        return None
    t = printable(v)
    return t if len(t) <= MAX_TEXT else t[: MAX_TEXT - 1] + "…"


def _labels(v: object) -> tuple[tuple[str, str], ...]:
    """Return every string label, sorted; a key too long to keep whole is left out."""
    if not isinstance(v, dict):
        return ()
    out: dict[str, str] = {}
    for k, val in v.items():
        key = printable(k) if isinstance(k, str) else ""
        if key and len(key) <= MAX_TEXT and isinstance(val, str):
            out[key] = _text(val) or ""
    return tuple(sorted(out.items()))


# --- Slurm ------------------------------------------------------------------------------------

_MARK = re.compile(r"@gpubot-(?:job ([0-9]{1,10})|end)")
_FIRST = re.compile(
    r"JobId=([0-9]{1,10}) (?:ArrayJobId=[0-9]+ ArrayTaskId=\S+ (?:ArrayTaskThrottle=[0-9]+ )?"
    r"|HetJobId=[0-9]+ HetJobOffset=[0-9]+ )?JobName=(.*)"
)
_USER_TOKEN = re.compile(r"(?:^|\s)UserId=")
_USER_LINE = re.compile(r"   UserId=([^\s()]{1,64})\(([0-9]{1,10})\) GroupId=")
_STATE_LINE = re.compile(r"   JobState=([A-Z_]{1,32})(?: |\Z)")
_NOBODY_UID = 65534


@dataclass(frozen=True)
class _Job:
    job: str
    user: str
    uid: int
    found: Found


def parse_scontrol(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Read the output of the ``slurm`` argv: a record for each asked job that is beyond doubt.

    The script's markers must come exactly as written (one per job in order, then the end), or
    nothing is trusted. In a job's part every record must carry exactly one ``UserId=`` (a
    second, or a token on another line, is forged text), all records there must name the same
    user (an array's tasks and a heterogeneous job's components share one), and the job itself
    must appear exactly once. A job gone from Slurm prints nothing and is simply absent.
    """
    asked = list(dict.fromkeys(i for i in ids if isinstance(i, str) and _JOB_ID.fullmatch(i)))
    parts = _segments(stdout, asked)
    if parts is None:
        return {}
    out: dict[str, Found] = {}
    for job, lines in parts.items():
        found = _segment(job, lines)
        if found is not None:
            out[job] = found
    return out


def _segments(stdout: str, asked: list[str]) -> dict[str, list[str]] | None:
    """Split the output at the script's markers; None unless they are exactly the expected."""
    got: list[str | None] = []
    parts: list[list[str]] = []
    for line in stdout.split("\n"):
        m = _MARK.fullmatch(line)
        if m is not None:
            got.append(m[1])
            parts.append([])
        elif parts:
            parts[-1].append(line)
    if got != [*asked, None]:
        return None
    return dict(zip(asked, parts, strict=False))


def _segment(job: str, lines: list[str]) -> Found | None:
    """Return ``job``'s record from its part of the output, or None when in any doubt."""
    starts = [n for n, line in enumerate(lines) if line.startswith("JobId=")]
    records = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=False)]
    parsed = [_record(r) for r in records]
    jobs = [p for p in parsed if p is not None]
    if not jobs or len(jobs) != len(parsed) or len({(j.user, j.uid) for j in jobs}) != 1:
        return None
    mine = [j for j in jobs if j.job == job]
    return mine[0].found if len(mine) == 1 else None


def _record(lines: list[str]) -> _Job | None:
    """Parse one record (its ``JobId=`` line and the lines up to the next); None if malformed."""
    first = _FIRST.fullmatch(lines[0])
    if first is None or sum(len(_USER_TOKEN.findall(line)) for line in lines) != 1:
        return None
    users = [m for m in map(_USER_LINE.match, lines[1:]) if m is not None]
    if len(users) != 1:
        return None
    user, uid = users[0][1], int(users[0][2])
    states = [m[1] for m in map(_STATE_LINE.match, lines[1:]) if m is not None]
    named = user if valid_user(user) and (user != "nobody" or uid == _NOBODY_UID) else None
    found = Found(
        name=_text(first[2]),
        user=named,
        uid=uid,
        state=states[0] if len(states) == 1 else None,
    )
    return _Job(job=first[1], user=user, uid=uid, found=found)


PARSERS: dict[str, Callable[[str, Sequence[str]], dict[str, Found]]] = {
    "docker": parse_docker_inspect,
    "podman": parse_podman_inspect,
    "crictl": parse_crictl_inspect,
    "slurm": parse_scontrol,
}


def parse_enrichment(runtime: str, stdout: str, ids: Sequence[str]) -> dict[str, Found]:
    """Parse the output of ``enrich_argv(runtime, ids, ...)`` with that runtime's parser."""
    parser = PARSERS.get(runtime)
    return parser(stdout, ids) if parser is not None else {}


# --- onto the workload ------------------------------------------------------------------------


def apply_enrichment(
    w: Workload,
    found: Found | None,
    owner_label: str | None,
    uid_names: Mapping[int, str] | None = None,
) -> Workload:
    """Put what a runtime said on ``w`` and decide its owner (``decide_owner``).

    ``found`` None (not found, lookup failed or timed out) marks ``name_unknown``. A record that
    contradicts what root's cgroup path says (another uid, another pod) counts as not found.
    """
    names = dict(uid_names or {})
    if w.get("outer") is not None:  # the outer container's record: its name and owner label
        pod = w.get("outer_pod_uid")
        if found is not None and pod and found.pod_uid and found.pod_uid != pod:
            found = None
        label = dict(found.labels).get(owner_label or "") if found and owner_label else None
        outer = {"outer_name": found.name if found else None, f"label.{owner_label}": label}
        return decide_owner(w.with_detail(**outer), names, owner_label)
    if found is not None and _contradicts(w, found):
        found = None
    if found is None:
        if w.kind in (
            WorkloadKind.DOCKER,
            WorkloadKind.PODMAN,
            WorkloadKind.KUBERNETES,
            WorkloadKind.SLURM,
        ):
            w = w.with_detail(name_unknown="yes")
    elif w.kind is WorkloadKind.SLURM:
        uid = str(found.uid) if found.uid is not None else None
        w = replace(w, name=found.name or w.name).with_detail(
            user=found.user, uid=uid, state=found.state
        )
    elif w.kind in (WorkloadKind.DOCKER, WorkloadKind.PODMAN, WorkloadKind.KUBERNETES):
        w = _apply_container(w, found, owner_label)
    return decide_owner(w, names, owner_label)


def _contradicts(w: Workload, found: Found) -> bool:
    uid = w.get("uid")
    if w.kind is WorkloadKind.SLURM and uid is not None and found.uid is not None:
        return uid != str(found.uid)
    pod = w.get("pod_uid")
    if w.kind is WorkloadKind.KUBERNETES and pod is not None and found.pod_uid is not None:
        return pod != found.pod_uid
    return False


def _apply_container(w: Workload, found: Found, owner_label: str | None) -> Workload:
    keep = [kv for kv in found.labels if kv[0] != owner_label][:MAX_LABELS]
    keep += [kv for kv in found.labels if kv[0] == owner_label]
    values: dict[str, str | None] = {f"label.{k}": v for k, v in keep}
    values["image"] = found.image
    if w.kind is WorkloadKind.KUBERNETES:
        ns, pod = found.namespace, found.pod
        name = f"{ns}/{pod}" if ns and pod else pod
        values.update(namespace=ns, pod=pod, container=found.name)
    else:
        name = found.name
        values["restart"] = found.restart
    return replace(w, name=name or w.name).with_detail(**values)
