"""Who a process works for: its container, Slurm job, pod, service or session, from its cgroup.

``parse_cgroup`` reads the whole ``/proc/PID/cgroup`` text. Every shape is matched from the
root of the hierarchy: a user may create cgroups only inside their own delegated subtree
(``/user.slice/user-UID.slice/user@UID.service/...``) and cannot move a process into a cgroup
elsewhere, so ``/system.slice/docker-ID.scope`` or ``/slurm/uid_U/job_J`` can only be where root
(dockerd, slurmd, the kubelet) put it. A lookalike inside a user's subtree is that user's
(a rootless container) or ``other``. Paths are as the kernel shows them to gpubot: relative to
the cgroup namespace of the probe, which must be the node's initial one.

The shapes, with their sources, are the table in ``core.cgroup_shapes``. A container found
inside another container's cgroup (docker-in-docker, a kind node's pods) is the inner one, named
only as a label: its owner, lookup and stop come from the outer container (``_nest``). A
runtime's own unit (``containerd.service``, ``slurmstepd.scope`` ...) is never a workload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gpubot.core.cgroup_shapes import MAX_NEST, REASONS, SHAPES, SLUID
from gpubot.core.names import is_linux_user
from gpubot.core.text import code


class WorkloadKind(StrEnum):
    """What kind of workload a process runs in."""

    DOCKER = "docker"
    PODMAN = "podman"
    KUBERNETES = "kubernetes"
    LXC = "lxc"
    SLURM = "slurm"
    SERVICE = "service"
    SESSION = "session"
    OTHER = "other"


@dataclass(frozen=True)
class Workload:
    """The workload of one process.

    ``owner`` is the Linux user the workload belongs to when something root controls says so
    (Slurm's job user, a configured container label, a rootless container's user slice); for a
    root container without that label it is ``root``. ``None``: the process's own user decides.
    Text a job's owner chose (names, images, labels) is marked by ``printable`` before it lands
    here, and ``detail`` holds only strings.
    """

    kind: WorkloadKind
    id: str  # container id, Slurm job id, pod uid, unit name, session, or the raw path
    name: str | None = None  # container name, Slurm job name, namespace/pod, unit
    owner: str | None = None
    detail: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str | None:
        """Return one detail value, or None."""
        return next((v for k, v in self.detail if k == key), None)

    def with_detail(self, **values: str | None) -> Workload:
        """Return a copy with these detail values set (None values are left out)."""
        keep = {k: v for k, v in self.detail if k not in values}
        keep.update({k: v for k, v in values.items() if v is not None})
        return replace(self, detail=tuple(sorted(keep.items())))

    @property
    def key(self) -> tuple[str, str, str]:
        """Return what tells two workloads apart: kind, id and, for a rootless container, its
        user. A user names the cgroups of their own subtree freely, so a rootless container may
        carry a root container's id: by kind and id alone the two would be one workload."""
        return str(self.kind), self.id, (self.get("uid") or "") if self.get("rootless") else ""

    @property
    def short(self) -> str:
        """Return a short label for tables: ``docker:train-llama``, ``slurm:8812.0``."""
        if self.kind is WorkloadKind.SLURM:
            step = self.get("step")
            return f"slurm:{self.id}" + (f".{step}" if step is not None else "")
        if self.kind is WorkloadKind.OTHER:
            return "other"
        wid = self.get("inner_id") or self.id
        label = self.name or (wid[:12] if _is_hex(wid) else wid)
        return f"{self.kind}:{label}"

    def describe(self) -> str:
        """Say what killing this workload's process kills, for plans and approvals.

        Every name is written by ``core.text.code`` (back-ticks, one line, none inside): a job
        name such as ``x` *pre-approved* `y`` stays one literal, and each front end shows it as
        one (a Slack code span, a terminal's text).
        """
        owner = f" of Linux user {code(self.owner)}" if self.owner else ""
        outer = self.get("outer")
        if outer is not None:
            name = self.get("outer_name") or outer[:12]
            inside = f"{self.kind} container {code((self.get('inner_id') or '?')[:12])}"
            return f"{inside} inside container {code(name)}{owner}"
        if self.kind in (WorkloadKind.DOCKER, WorkloadKind.PODMAN):
            image = self.get("image")
            img = f" (image {code(image)})" if image else ""
            return f"container {code(self.name or self.id[:12])}{img}{owner}"
        if self.kind is WorkloadKind.KUBERNETES:
            pod = self.name or f"pod {self.get('pod_uid') or '?'}"
            return f"Kubernetes pod {code(pod)}{owner}"
        if self.kind is WorkloadKind.LXC:
            return f"LXC/LXD container {code(self.id)}{owner}"
        if self.kind is WorkloadKind.SLURM:
            step = self.get("step")
            bits = [
                f"user {code(self.owner)}" if self.owner else None,
                f"job name {code(self.name)}" if self.name else None,
            ]
            said = ", ".join(b for b in bits if b)
            return (
                f"Slurm job {self.id}"  # digits and [a-z0-9]+ only (the cgroup shapes)
                + (f" step {step}" if step else "")
                + (f" ({said})" if said else "")
            )
        if self.kind is WorkloadKind.SERVICE:
            return f"systemd service {code(self.id)}"
        if self.kind is WorkloadKind.SESSION:
            uid = self.get("uid")  # digits only (the cgroup shape)
            return f"login session {code(self.id)}" + (f" of uid {uid}" if uid else "")
        return f"cgroup {code(self.id)}"

    @classmethod
    def from_dict(cls, d: Any) -> Workload | None:
        """Rebuild a workload from ``to_dict`` output (a stored plan); None for None."""
        if d is None:
            return None
        detail = d.get("detail") or {}
        if isinstance(detail, list):  # a plan's asdict() keeps the pairs as lists
            detail = dict(detail)
        return cls(
            WorkloadKind(d["kind"]),
            str(d["id"]),
            d.get("name"),
            d.get("owner"),
            tuple(sorted((str(k), str(v)) for k, v in detail.items())),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the ``status --json`` form."""
        return {
            "kind": str(self.kind),
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "detail": dict(self.detail),
        }


_CONTAINERS = (WorkloadKind.DOCKER, WorkloadKind.PODMAN, WorkloadKind.KUBERNETES, WorkloadKind.LXC)

# v1 hierarchies to read when the v2 line says nothing (a hybrid or v1-only box), best first.
_V1_ORDER = ("name=systemd", "memory", "pids", "cpu,cpuacct", "devices", "cpuset")


_LINE = re.compile(r"(\d+):([^:\n]*):(/[^\n]*)\Z")

# Specific shapes (root put the process there) beat generic ones: on a hybrid box a Slurm
# task of the v1 cgroup plugin shows ``0::/system.slice/slurmd.service`` on its v2 line.
_RANK = {WorkloadKind.SERVICE: 1, WorkloadKind.SESSION: 1, WorkloadKind.OTHER: 2}


def cgroup_paths(text: str) -> list[str] | None:
    """Return the paths of a whole ``/proc/PID/cgroup`` text, the v2 one first, then the v1
    hierarchies in ``_V1_ORDER`` and the rest; None when the text is not what the kernel writes.

    The kernel writes one ``ID:CONTROLLERS:PATH`` line per hierarchy, IDs strictly falling to
    the v2 line ``0::PATH``, which comes last. A cgroup name may hold a newline (a user may name
    a cgroup in their own subtree anything), and the kernel does not escape it: such a name
    could forge a line. Any repeated or out-of-order ID, or malformed line, makes the whole
    text untrusted.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    last: int | None = None
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            return None
        hid = int(m[1])
        if (last is not None and hid >= last) or (hid == 0) != (m[2] == ""):
            return None
        last = hid
        if hid == 0:
            v2 = m[3]
        else:
            v1[m[2]] = m[3]
    order = [v1[k] for k in _V1_ORDER if k in v1] + [p for k, p in v1.items() if k not in _V1_ORDER]
    return ([v2] if v2 is not None else []) + order


def parse_cgroup(text: str | None) -> Workload | None:
    """Return the workload a ``/proc/PID/cgroup`` text names; None when it says nothing.

    Each path is matched against the shapes; the most specific match wins (a container or job
    over a service or session over ``other``; a container nested in another over the outer
    one). Text that is not the kernel's shape is ``other`` with ``untrusted`` in its detail: it
    names no owner.
    """
    if not text:
        return None
    paths = cgroup_paths(text)
    if paths is None:
        return Workload(WorkloadKind.OTHER, printable_path(text)).with_detail(untrusted="yes")
    found = [w for w in (_match(p) for p in paths if p != "/") if w is not None]
    if not found:
        return None
    return min(found, key=lambda w: (_RANK.get(w.kind, 0), w.get("outer") is None))


def printable_path(text: str) -> str:
    """Return ``text`` with non-printable characters as ``\\xNN``, at most 300 of them."""
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return out[:300]


def match_path(path: str) -> Workload:
    """Return the workload one cgroup path (as ``/proc/PID/cgroup`` shows it) names."""
    return _match(path)


def _match(path: str, depth: int = 0) -> Workload:
    for kind, pattern in SHAPES:
        m = pattern.match(path)
        if m is not None:
            g = {k: v for k, v in m.groupdict().items() if v is not None}
            w = _build(WorkloadKind(kind), path, g)
            tail = g.get("tail")
            if tail and w.kind in _CONTAINERS and depth < MAX_NEST and _lookup_id(w):
                inner = _match(tail, depth + 1)
                if inner.kind in _CONTAINERS:
                    return _nest(w, inner)
            return w
    return Workload(WorkloadKind.OTHER, printable_path(path)).with_detail(
        reason="no known workload shape"
    )


def _build(kind: WorkloadKind, path: str, g: dict[str, str]) -> Workload:
    if kind is WorkloadKind.KUBERNETES:
        pod = g["pod"].replace("_", "-")
        runtime = {"cri-containerd": "containerd", "crio": "cri-o"}.get(g.get("rt", ""))
        return Workload(kind, g.get("id") or pod).with_detail(
            pod_uid=pod,
            qos=g.get("qos", "guaranteed"),
            runtime=runtime or g.get("rt"),
            container_id=g.get("id"),
        )
    if kind is WorkloadKind.SLURM:
        job = g.get("job") or g["sluid"]
        return Workload(kind, job).with_detail(step=g.get("step"), uid=g.get("uid"))
    if kind in (WorkloadKind.SERVICE, WorkloadKind.SESSION):
        return Workload(kind, g["unit"]).with_detail(uid=g.get("uid"))
    if kind is WorkloadKind.OTHER:
        why = next(r for k, r in REASONS.items() if k in g)
        return Workload(kind, printable_path(path)).with_detail(reason=why)
    if kind is WorkloadKind.LXC:
        return Workload(kind, g["id"], name=g["id"])
    return Workload(kind, g["id"]).with_detail(
        uid=g.get("uid"), rootless="yes" if "uid" in g else None
    )


def _lookup_id(w: Workload) -> str | None:
    """Return the id the host's runtime knows ``w`` by (a pod's container id), or None."""
    if w.kind is WorkloadKind.KUBERNETES:
        return w.get("container_id")
    return w.id


def _nest(outer: Workload, inner: Workload) -> Workload:
    """Return the workload of a container found inside ``outer``'s cgroup: docker-in-docker, a
    kind node's pods, a container run by a container's own systemd.

    The outer container's root made the inner cgroup, and chose its name: the inner id is taken
    only as a label, never looked up in the host's runtimes nor put in a stop command (it could
    be another container's). The workload's id joins both, so it is no host container's id;
    what root controls (owner, rootless uid, lookup) comes from the outer container.
    """
    inner_id = inner.get("inner_id") or _lookup_id(inner) or inner.id
    keep = {k: v for k, v in inner.detail if k in ("pod_uid", "qos", "runtime")}
    return Workload(inner.kind, f"{outer.id}/{inner_id}").with_detail(
        **keep,
        outer=outer.id,
        outer_kind=str(outer.kind),
        inner_id=inner_id,
        uid=outer.get("uid"),
        rootless=outer.get("rootless"),
        outer_pod_uid=outer.get("pod_uid"),
    )


def _is_hex(s: str) -> bool:
    return bool(s) and all(c in "0123456789abcdef" for c in s)


# --- who it belongs to, and how to stop it for good ------------------------------------------

_SLUID = re.compile(SLUID)
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # docker/podman container names


def valid_user(name: str | None) -> bool:
    """Whether ``name`` is a well-formed Linux user name."""
    return is_linux_user(name)


def decide_owner(w: Workload, uid_names: dict[int, str], owner_label: str | None) -> Workload:
    """Set ``owner`` from what root controls: never from a name a process gave itself.

    Slurm: the job user (the ``uid_U`` of a v1 path, or the ``user`` scontrol gave). A container:
    the user named by the ``owner_label`` label (when configured and well formed), a rootless
    one's user slice, else ``root``. Services, sessions and others: None (the process's user).
    """
    uid = w.get("uid")
    by_uid = uid_names.get(int(uid)) if uid is not None else None
    if w.kind is WorkloadKind.SLURM:
        owner = by_uid or w.get("user")
    elif w.kind in _CONTAINERS:
        label = w.get(f"label.{owner_label}") if owner_label else None
        if w.get("rootless"):
            owner = by_uid  # a label cannot hand a user's own container to someone else
        elif valid_user(label):
            owner = label
        else:
            owner = "root"
    else:
        owner = None
    return replace(w, owner=owner if valid_user(owner) else None)


def stop_command(w: Workload) -> str | None:
    """Return the command that stops this workload for good (a restart policy, a requeue).

    Only ids and names of a safe shape are put in a command; None when there is none to give:
    a runtime's own unit, a container inside another (the host's runtime does not know it, and
    its id was chosen inside the outer one), an LXC container (``lxc stop`` and ``lxc-stop``
    are different tools, and gpubot cannot tell which one manages it).
    """
    if w.get("outer") is not None:
        return None
    if w.kind in (WorkloadKind.DOCKER, WorkloadKind.PODMAN) and not w.get("rootless"):
        who = w.name if w.name and _NAME_OK.match(w.name) else w.id[:12]
        return f"{w.kind} stop {who}"
    if w.kind is WorkloadKind.SLURM and (w.id.isdigit() or _SLUID.fullmatch(w.id)):
        return f"scancel {w.id}"  # scancel takes a SLUID too (Slurm 26.05, src/scancel/opt.c)
    if w.kind is WorkloadKind.SERVICE and re.fullmatch(r"[A-Za-z0-9:_.@-]+\.service", w.id):
        return f"systemctl stop {w.id}"
    return None


def may_restart(w: Workload | None) -> bool:
    """Whether something may start this workload's process again once it is killed.

    A container with a restart policy other than ``no`` (or an unknown one), a pod (the kubelet
    restarts containers), a Slurm job (its batch script may start the next step) or a service.
    """
    if w is None:
        return False
    if w.kind in (WorkloadKind.DOCKER, WorkloadKind.PODMAN):
        return w.get("restart") not in ("no", "")
    restarts = (WorkloadKind.KUBERNETES, WorkloadKind.LXC, WorkloadKind.SLURM, WorkloadKind.SERVICE)
    return w.kind in restarts


def stop_argv(w: Workload) -> list[str] | None:
    """Return ``stop_command`` as an argv (what ``[reset] stop_workloads`` runs), or None."""
    cmd = stop_command(w)
    return cmd.split(" ") if cmd else None
