"""LXC and LXD (and Incus): system containers, each with its own init.

Cgroup shapes (lxc.container.conf(5) ``lxc.cgroup.dir``; LXC 4.0 release notes):
``/lxc.payload.NAME`` and ``/lxc.monitor.NAME`` (LXC 4+ and LXD), ``/lxc/NAME`` (LXC 3 and
older). The monitor holds LXC's own process, not the container's.

No stop command: ``lxc stop`` (LXD) and ``lxc-stop`` (LXC) are different tools, and gpubot
cannot tell which one manages a container. No lookup: the name is in the path.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpubot.core import text
from gpubot.core.runtimes.base import (
    NEST,
    TAIL,
    Runtime,
    Shape,
    Workload,
    always,
    container_owner,
    owned,
)

_NAME = r"(?P<id>[A-Za-z0-9][A-Za-z0-9_.+-]{0,63})"


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    return Workload(kind, g["id"], name=g["id"])


def _describe(w: Workload) -> str:
    return f"LXC/LXD container {text.code(w.id)}{owned(w)}"


RUNTIME = Runtime(
    kind="lxc",
    shapes=(
        Shape(rf"/lxc\.payload[./]{_NAME}{NEST}"),
        Shape(rf"/lxc/{_NAME}{NEST}"),
        Shape(
            r"/lxc\.monitor[./](?P<reason_lxc_monitor>[^/]+)" + TAIL,
            reason="LXC's monitor of a container, not the container",
        ),
    ),
    daemons=(r"snap\.lxd\.daemon\.service", r"lxd\.service", r"lxc\.service"),
    build=_build,
    describe=_describe,
    owner=container_owner,
    restarts=always,  # the container's own init starts its services again
    nests=True,
)
