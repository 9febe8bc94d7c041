"""systemd-machined machines: systemd-nspawn containers and libvirt's VMs and containers.

Cgroup shapes: machined puts each machine it registers in ``machine-NAME.scope`` in
``machine.slice`` (systemd-machined(8)), e.g. a libvirt VM's
``0::/machine.slice/machine-qemu\\x2d18\\x2dDroplet\\x2d7572850.scope/emulator``;
``machinectl start NAME`` runs a container as ``systemd-nspawn@NAME.service`` in the same slice
(systemd-nspawn(1)). From systemd 244 the container's own tree is below
``payload/`` and nspawn itself in ``supervisor/``. Only root makes cgroups in ``machine.slice``;
an unprivileged user's machine is in their own ``user@UID.service`` (their session).

A name is written escaped the way systemd writes unit names (``-`` as ``\\x2d``): the
machine's name is the unescaped one, used in a stop command only when it is a plain host
name. ``machinectl terminate NAME`` stops any registered machine, container or VM, and every
process in it; a booted container's own init restarts its services, so it may come back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpubot.core import text
from gpubot.core.runtimes.base import (
    NEST,
    Runtime,
    Shape,
    Workload,
    always,
    container_owner,
    owned,
)

_ESCAPED = r"[A-Za-z0-9:_.\\-]{1,200}"  # a unit name's instance, as systemd escapes it
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a machine name gpubot puts in a command
_HEX = re.compile(r"\\x([0-9a-f]{2})")


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    escaped = g["id"]
    name = _HEX.sub(lambda m: chr(int(m[1], 16)), escaped)
    return Workload(kind, escaped, name=name if _NAME_OK.fullmatch(name) else None).with_detail(
        unit=g["unit"]
    )


def _describe(w: Workload) -> str:
    return f"machine {text.code(w.name or w.id)} (a systemd-machined container or VM){owned(w)}"


def _stop(w: Workload) -> list[str] | None:
    return ["machinectl", "terminate", w.name] if w.name else None


def _is_root(w: Workload, comp: str, prev: str) -> bool:
    return comp == w.get("unit")


RUNTIME = Runtime(
    kind="machine",
    shapes=(
        Shape(rf"/machine\.slice/(?P<unit>machine-(?P<id>{_ESCAPED})\.scope)(?:/payload)?{NEST}"),
        Shape(
            rf"/machine\.slice/(?P<unit>systemd-nspawn@(?P<id>{_ESCAPED})\.service)"
            rf"(?:/payload)?{NEST}"
        ),
    ),
    daemons=(r"systemd-machined\.service",),
    build=_build,
    describe=_describe,
    owner=container_owner,  # root's, unless the configured owner label says otherwise
    stop=_stop,
    restarts=always,
    is_root=_is_root,
    noun="machine `{}`",
    nests=True,  # a container's own docker or podman
)
