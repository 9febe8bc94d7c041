"""What one runtime module gives, and the workload every runtime names.

A runtime (a container engine, a scheduler, systemd ...) is one ``Runtime`` value in one module of
this package: its kind, the cgroup shapes that name its workloads (``Shape``), how it says what
a workload is (``describe``, ``short``), whose a workload is (``owner``), how to stop one for good
and whether it comes back (``stop``, ``restarts``), the sudoers lines it needs, and optionally how
to ask the runtime for names (``Lookup``). ``gpubot.core.runtimes`` lists them; everything else
iterates that list. A workload's ``kind`` is its runtime's ``kind``, a plain string.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

from gpubot.core import text
from gpubot.core.names import is_linux_user
from gpubot.core.text import one_line

# Fragments the shapes share (see each runtime's module for its sources).
HEX64 = r"[0-9a-f]{64}"
TAIL = r"(?:/.*)?"  # cgroups a workload made inside its own (a container's init.scope ...)
NEST = r"(?P<tail>/.*)?"  # the same, where a container's root may have nested another one
ROOT_SLICES = r"/(?:(?!user\.slice/)[^/]+\.slice/)*"  # slices only root can make
USER_MANAGER = r"/user\.slice/user-(?P<uid>\d+)\.slice/user@\d+\.service/(?:[^/]+/)*"
HEX64_ID = re.compile(HEX64)
OTHER = "other"  # the kind of what no runtime names, or names as no workload


def printable_path(text: str) -> str:
    """Return ``text`` with non-printable characters as ``\\xNN``, at most 300 of them."""
    return one_line(text)[:300]


def valid_user(name: str | None) -> bool:
    """Whether ``name`` is a well-formed Linux user name (``core.names``)."""
    return is_linux_user(name)


@dataclass(frozen=True)
class Workload:
    """The workload of one process.

    ``owner`` is the Linux user the workload belongs to when something root controls says so
    (Slurm's job user, a configured container label, a rootless container's user slice); for a
    root container without that label it is ``root``. ``None``: the process's own user decides.
    Text a job's owner chose (names, images, labels) is marked by ``printable`` before it lands
    here, and ``detail`` holds only strings.
    """

    kind: str  # its runtime's kind
    id: str  # container id, Slurm job id, pod uid, unit name, session, or the raw path
    name: str | None = None  # container name, Slurm job name, namespace/pod, unit
    owner: str | None = None
    detail: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str | None:
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

    def to_dict(self) -> dict[str, Any]:
        """Return the ``status --json`` form."""
        return {
            "kind": str(self.kind),
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "detail": dict(self.detail),
        }


class Rank(IntEnum):
    """Where a shape stands among all runtimes' shapes: the first that matches a path wins."""

    ROOT = 0  # a place only root (a daemon, slurmd, the kubelet) makes: a container, a job
    USER = 1  # inside a user's own subtree (a rootless container): before that user's session
    SESSION = 2  # a login session or a user's manager
    UNIT = 3  # a known unit that is no workload (a runtime's own daemon, sshd, cron)
    SERVICE = 4  # any other system service: last


@dataclass(frozen=True)
class Shape:
    """One cgroup path pattern, matched over the whole path from the root of the hierarchy.

    Named groups carry what the path says (``id``, ``uid``, ``unit`` ...); a ``tail`` group marks
    a container's own subtree, where its root may nest another container. ``reason``: a known
    shape that is no workload gpubot may name, advise or stop (``other``); its pattern holds
    one group named ``reason_*``.
    """

    pattern: str
    rank: Rank = Rank.ROOT
    reason: str | None = None


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


def _never(*_: object) -> bool:
    return False


@dataclass(frozen=True)
class Lookup:
    """How to ask a runtime about its workloads: one bounded exec for all ids of a node.

    ``tool`` is the name a node lists in its settings (``runtimes = ["docker", "crictl"]``).
    ``argv(ids, sudo)`` is the command after coreutils ``timeout`` (``sudo`` is the prefix to use
    or empty), ``parse`` reads its standard output into a record per id found beyond doubt,
    ``target`` gives the id to ask about (only one matching ``ids`` is asked), ``apply`` puts a
    record on a workload, and ``contradicts`` says when a record disagrees with what root's
    cgroup path says (such a record counts as not found). ``sudo``: the sudoers command the
    lookup runs as root (``docker inspect *``; None: it needs no root), what the README's
    ``GPUBOT_INSPECT`` lists.
    """

    tool: str
    ids: re.Pattern[str]
    argv: Callable[[Sequence[str], Sequence[str]], list[str]]
    parse: Callable[[str, Sequence[str]], dict[str, Found]]
    target: Callable[[Workload], str | None]
    apply: Callable[[Workload, Found, str | None], Workload]
    contradicts: Callable[[Workload, Found], bool] = _never
    sudo: str | None = None


def default_short(w: Workload) -> str:
    """``kind:name``, or the first 12 digits of a hex id, or the id."""
    wid = w.get("inner_id") or w.id
    label = w.name or (wid[:12] if wid and all(c in "0123456789abcdef" for c in wid) else wid)
    return f"{w.kind}:{label}"


def _none(*_: object) -> None:
    return None


def own_id(w: Workload) -> str | None:
    return w.id


@dataclass(frozen=True)
class Runtime:
    """Everything gpubot knows about one runtime (see the module docstring).

    ``build(kind, path, groups)`` makes the workload of a matched path. ``owner(w, by_uid,
    label)`` is the owner rule, from the name of the path's uid and the value of the configured
    owner label: only what root controls. ``stop`` is the argv that stops the workload for good
    (None when there is none to give), ``restarts`` whether something starts it again once its
    process is killed, ``is_root(w, component, previous)`` whether a path component is the
    workload's own cgroup directory (what its stop kills).
    ``nests``: a container, whose root may nest another container in its cgroup; ``host_id`` is
    the id the host's runtime knows it by. ``generic`` ranks a process's hierarchies: the most
    specific workload wins (0 a container or job, 1 a service or session, 2 ``other``).
    ``named``: whether a workload of the kind is worth naming to people (a bare login session or
    an unknown cgroup is not). ``root_helpers``: the process names (``comm``) of the runtime's
    own helpers that run as root inside each workload's cgroup (slurm's ``slurmstepd``): a
    self-service stop does not count them as another user's processes.
    ``daemons``: patterns of the runtime's own units, never a workload. ``sudo_stop``: the
    sudoers command its ``stop`` runs as root (``docker stop *``), what the README's
    ``GPUBOT_STOP`` lists and ``doctor`` checks.
    """

    kind: str
    build: Callable[[str, str, Mapping[str, str]], Workload]
    describe: Callable[[Workload], str]
    shapes: tuple[Shape, ...] = ()
    daemons: tuple[str, ...] = ()
    short: Callable[[Workload], str] = default_short
    owner: Callable[[Workload, str | None, str | None], str | None] = _none
    stop: Callable[[Workload], list[str] | None] = _none
    stop_note: str | None = None  # what its stop ends beyond the node, for approvers
    restarts: Callable[[Workload], bool] = _never
    is_root: Callable[[Workload, str, str], bool] = _never
    noun: str = "container `{}`"  # how a stop names it, given the stop's last argument
    lookup: Lookup | None = None
    nests: bool = False
    host_id: Callable[[Workload], str | None] = own_id
    generic: int = 0
    named: bool = True  # worth naming in a plan, a table or an idle line
    root_helpers: tuple[str, ...] = ()
    sudo_stop: str | None = None


# --- rules that several runtimes share ----------------------------------------------------------


def owned(w: Workload) -> str:
    """`` of Linux user `alice```, or nothing when the workload has no owner."""
    if w.owner and is_uid_owner(w.owner):
        return f" of {text.code(w.owner)}"  # no name on the node: `uid 1003`
    return f" of Linux user {text.code(w.owner)}" if w.owner else ""


UID_OWNER = re.compile(r"uid [0-9]{1,10}")


def is_uid_owner(owner: str | None) -> bool:
    """Whether ``owner`` is an unnamed slice's uid (``uid 1003``: no Linux name has a space)."""
    return owner is not None and UID_OWNER.fullmatch(owner) is not None


def container_owner(w: Workload, by_uid: str | None, label: str | None) -> str | None:
    """A container's owner: a rootless one's user slice; else the owner label when configured
    and well formed (a label cannot hand a user's own container to someone else); else root.

    A rootless container is its user's, whoever it runs as inside: the ``user-U.slice`` of its
    path is root's to give. Its processes may run as a subordinate uid (231072) that no one is
    called; that uid never names the owner. A slice uid with no name is said ``uid U``.
    """
    if w.get("rootless"):
        uid = w.get("uid")
        if valid_user(by_uid) or uid is None:
            return by_uid
        return f"uid {uid}"
    return label if valid_user(label) else "root"


def container_build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    """A docker or podman container: its id, and the uid of a rootless one's user slice."""
    return Workload(kind, g["id"]).with_detail(
        uid=g.get("uid"), rootless="yes" if "uid" in g else None
    )


def always(w: Workload) -> bool:
    """Something restarts it (the kubelet, a container's own init, Slurm, systemd)."""
    return True
