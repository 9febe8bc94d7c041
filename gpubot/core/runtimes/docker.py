"""Docker: containers of dockerd, rootful or rootless.

Cgroup shapes (docs.docker.com, ``native.cgroupdriver``): ``/system.slice/docker-ID.scope``
(systemd driver), ``/docker/ID`` (cgroupfs); docker-in-docker ``/docker/OUTER/docker/INNER``;
a rootless daemon's containers under the user's own ``user@UID.service``.

Lookup: ``docker inspect --type container ID...`` (docs.docker.com/reference/cli/docker/inspect):
one JSON array of the objects found, even when it exits 1 for an id it cannot find; ``Name``
has a leading ``/``; ``Config.Labels`` may be null; ``HostConfig.RestartPolicy.Name``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from gpubot.core import text
from gpubot.core.runtimes import inspect_json
from gpubot.core.runtimes.base import (
    HEX64,
    HEX64_ID,
    NEST,
    USER_MANAGER,
    Found,
    Lookup,
    Rank,
    Runtime,
    Shape,
    Workload,
    container_build,
    container_owner,
    owned,
)

NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # docker/podman container names


def _found(o: dict[str, Any]) -> Found:
    name = o.get("Name")
    return Found(
        name=inspect_json.text(name.removeprefix("/") if isinstance(name, str) else None),
        image=inspect_json.text(inspect_json.at(o, "Config", "Image")),
        restart=inspect_json.text(inspect_json.at(o, "HostConfig", "RestartPolicy", "Name")),
        labels=inspect_json.labels(inspect_json.at(o, "Config", "Labels")),
    )


parse_docker_inspect = inspect_json.parser(lambda o: o.get("Id"), _found)


def describe_container(w: Workload) -> str:
    """``container `name` (image `img`) of Linux user `alice```."""
    image = w.get("image")
    img = f" (image {text.code(image)})" if image else ""
    return f"container {text.code(w.name or w.id[:12])}{img}{owned(w)}"


def container_stop(w: Workload) -> list[str] | None:
    """``docker stop NAME`` (or podman's): by a name of a safe shape, else the short id; none for
    a rootless container (the system's daemon does not know it)."""
    if w.get("rootless"):
        return None
    who = w.name if w.name and NAME_OK.match(w.name) else w.id[:12]
    return [str(w.kind), "stop", who]


def policy_restarts(w: Workload) -> bool:
    """A restart policy other than ``no`` (or an unknown one) starts it again."""
    return w.get("restart") not in ("no", "")


def container_parts(
    kind: str, parse: Callable[[str, Sequence[str]], dict[str, Found]]
) -> dict[str, Any]:
    """The ``Runtime`` fields a docker-CLI-like runtime (docker, podman) shares: its inspect,
    describe, owner, stop and restart rules."""
    return dict(
        build=container_build,
        describe=describe_container,
        owner=container_owner,
        stop=container_stop,
        restarts=policy_restarts,
        lookup=Lookup(
            tool=kind,
            ids=HEX64_ID,
            argv=inspect_json.inspect_argv(kind),
            parse=parse,
            target=inspect_json.rootful_id,
            apply=inspect_json.apply_container,
            sudo=f"{kind} inspect *",
        ),
        nests=True,
        sudo_stop=f"{kind} stop *",
    )


RUNTIME = Runtime(
    kind="docker",
    shapes=(
        Shape(rf"/system\.slice/docker-(?P<id>{HEX64})\.scope{NEST}"),
        Shape(rf"/docker/(?P<id>{HEX64}){NEST}"),
        # Rootless: inside the user's own subtree, so the user's, whatever they say.
        Shape(rf"{USER_MANAGER}docker-(?P<id>{HEX64})\.scope{NEST}", Rank.USER),
    ),
    daemons=(r"docker\.service", r"snap\.docker\.dockerd\.service"),
    is_root=lambda w, comp, prev: (
        comp == f"docker-{w.id}.scope" or (prev, comp) == ("docker", w.id)
    ),
    **container_parts("docker", parse_docker_inspect),
)
