"""What a spawn asks for besides a GPU: the container, pod or job of its cgroup, checked.

``SimNode.spawn(cgroup=KIND, container_name=..., pod=..., job_name=...)`` passes its options
to ``make_spec``, which refuses what the kind does not take or a real runtime would not accept
(docker's container names, Kubernetes' DNS labels, a restart policy) with a ``SimUsageError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpusim.cgroups import KINDS
from gpusim.errors import SimUsageError
from gpusim.runtime_registry import RESTARTS

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # docker's container names
_DNS = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # a Kubernetes namespace / pod name
# What each kind of workload takes besides its kind (service and session: nothing).
TAKES = {
    "docker": {"container_name", "image", "labels", "restart"},
    "podman": {"container_name", "image", "labels", "restart"},
    "kubernetes": {"container_name", "image", "labels", "pod"},
    "slurm": {"job_name", "job_user"},
}


@dataclass(frozen=True)
class Spec:
    """A workload's container, pod or job, as ``SimNode.spawn`` was asked for it."""

    kind: str
    name: str | None = None  # container name (docker, podman, kubernetes)
    image: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    restart: str | None = None  # docker, podman
    pod: tuple[str, str] | None = None  # (namespace, name), kubernetes
    job_name: str | None = None  # slurm
    job_user: str | None = None  # slurm

    @property
    def restarts(self) -> bool:
        """Whether a restart policy brings the container back when its process dies."""
        return self.restart not in (None, "no")


def make_spec(
    kind: str | None,
    *,
    container_name: str | None = None,
    image: str | None = None,
    labels: Mapping[str, str] | None = None,
    restart: str | None = None,
    pod: str | None = None,
    job_name: str | None = None,
    job_user: str | None = None,
) -> Spec | None:
    """Check what a spawn asks for; return None for no cgroup. Bad input: ``SimUsageError``.

    Containers take ``container_name``, ``image``, ``labels``; docker and podman a ``restart``
    policy (``always``, ``on-failure``, ``unless-stopped``: the ``respawn`` behaviour, the
    supervisor standing in for the daemon's restart manager, until ``docker stop``); kubernetes
    a ``pod`` (``NAMESPACE/NAME``); slurm ``job_name`` and ``job_user`` (whom the job runs as).
    """
    given = {
        "container_name": container_name,
        "image": image,
        "labels": labels,
        "restart": restart,
        "pod": pod,
        "job_name": job_name,
        "job_user": job_user,
    }
    if kind is None:
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra:
            raise SimUsageError(f"{', '.join(extra)} needs a cgroup kind ({', '.join(KINDS)})")
        return None
    if kind not in KINDS:
        raise SimUsageError(f"unknown cgroup kind {kind!r} (one of {', '.join(KINDS)})")
    extra = sorted(k for k, v in given.items() if v is not None and k not in TAKES.get(kind, ()))
    if extra:
        raise SimUsageError(f"a {kind} workload takes no {', '.join(extra)}")
    pairs = _check_container(container_name, image, labels)
    if restart is not None and restart not in RESTARTS:
        raise SimUsageError(f"unknown restart policy {restart!r} (one of {', '.join(RESTARTS)})")
    ns_name: tuple[str, str] | None = None
    if pod is not None:
        ns, _, name = str(pod).partition("/")
        if not (_DNS.match(ns) and _DNS.match(name)):
            raise SimUsageError(f"bad pod {pod!r}: NAMESPACE/NAME, lower-case DNS labels")
        ns_name = (ns, name)
    if job_name is not None and not (
        isinstance(job_name, str) and 0 < len(job_name) <= 200 and job_name.isprintable()
    ):
        raise SimUsageError(f"bad Slurm job name {job_name!r}")
    if job_user is not None and not isinstance(job_user, str):
        raise SimUsageError(f"bad Slurm job user {job_user!r}")
    return Spec(
        kind, container_name, image, tuple(sorted(pairs)), restart, ns_name, job_name, job_user
    )


def _check_container(
    container_name: str | None, image: str | None, labels: Mapping[str, str] | None
) -> list[tuple[str, str]]:
    """Check a container's name, image and labels; return the labels as pairs."""
    if container_name is not None and not (
        isinstance(container_name, str) and _NAME.match(container_name)
    ):
        raise SimUsageError(
            f"bad container name {container_name!r} (docker's [a-zA-Z0-9][a-zA-Z0-9_.-]*)"
        )
    if image is not None and not (
        isinstance(image, str)
        and 0 < len(image) <= 255
        and all(c.isprintable() and not c.isspace() for c in image)
    ):
        raise SimUsageError(f"bad image name {image!r}")
    if labels is not None and not isinstance(labels, Mapping):
        raise SimUsageError(f"labels must be a mapping of text to text, not {labels!r}")
    pairs: list[tuple[str, str]] = []
    for k, v in (labels or {}).items():
        if not (isinstance(k, str) and isinstance(v, str)) or not k or "=" in k or "\0" in k + v:
            raise SimUsageError(f"bad label {k!r}={v!r} (a non-empty key without '=', text values)")
        pairs.append((k, v))
    return pairs
