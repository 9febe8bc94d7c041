"""Podman: containers of libpod, rootful or rootless (no daemon: conmon watches each one).

Cgroup shapes (podman(1) ``--cgroup-manager``): ``/machine.slice/libpod-ID.scope`` (or in
``system.slice``), ``/libpod_parent/libpod-ID`` (cgroupfs); rootless under the user's own
``user@UID.service``.

Lookup: ``podman inspect --type container ID...`` (podman-inspect(1), ``--type`` since 1.x,
podman-container-inspect(1) example): the same array shape as docker's; ``Name`` without ``/``,
``ImageName``, ``Config.Labels`` (null in the manual's example).
"""

from __future__ import annotations

from typing import Any

from gpubot.core.runtimes import inspect_json
from gpubot.core.runtimes.base import (
    HEX64,
    NEST,
    USER_MANAGER,
    Found,
    Rank,
    Runtime,
    Shape,
)
from gpubot.core.runtimes.docker import container_parts


def _found(o: dict[str, Any]) -> Found:
    return Found(
        name=inspect_json.text(o.get("Name")),
        image=inspect_json.text(o.get("ImageName"))
        or inspect_json.text(inspect_json.at(o, "Config", "Image")),
        restart=inspect_json.text(inspect_json.at(o, "HostConfig", "RestartPolicy", "Name")),
        labels=inspect_json.labels(inspect_json.at(o, "Config", "Labels")),
    )


parse_podman_inspect = inspect_json.parser(lambda o: o.get("Id"), _found)


RUNTIME = Runtime(
    kind="podman",
    shapes=(
        Shape(rf"/(?:machine|system)\.slice/libpod-(?P<id>{HEX64})\.scope{NEST}"),
        Shape(rf"/libpod_parent/libpod-(?P<id>{HEX64}){NEST}"),
        # Rootless: inside the user's own subtree, so the user's, whatever they say.
        Shape(rf"{USER_MANAGER}libpod-(?P<id>{HEX64})\.scope{NEST}", Rank.USER),
    ),
    daemons=(r"podman\.service",),
    is_root=lambda w, comp, prev: comp in (f"libpod-{w.id}.scope", f"libpod-{w.id}"),
    **container_parts("podman", parse_podman_inspect),
)
