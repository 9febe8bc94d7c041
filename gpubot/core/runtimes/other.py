"""What is no workload gpubot may name, advise or stop: ``other``, with the reason why.

Every runtime may give shapes with a ``reason`` (a runtime's own daemon, LXC's monitor, sshd's
unit); they and any path no shape knows are ``other``, named by the raw path, owned by nobody,
never stopped. Shapes of no runtime of their own are here.

Apptainer/Singularity ``--apply-cgroups``: ``apptainer-PID.scope`` in ``system.slice`` or
``/apptainer/PID`` (``singularity`` before the rename): named by a PID, so no stable id.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpubot.core import text
from gpubot.core.runtimes.base import (
    OTHER,
    TAIL,
    Rank,
    Runtime,
    Shape,
    Workload,
    printable_path,
)


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    return Workload(kind, printable_path(path)).with_detail(reason=g.get("reason"))


def _describe(w: Workload) -> str:
    return f"cgroup {text.code(w.id)}"


def _short(w: Workload) -> str:
    return "other"


_APPTAINER = "Apptainer cgroup named by its starter's PID: no stable container id"

RUNTIME = Runtime(
    kind=OTHER,
    shapes=(
        Shape(
            r"(?:/system\.slice/(?P<reason_apptainer>(?:apptainer|singularity)(?:-oci)?-[^/]+"
            r"\.scope)|/(?P<reason_apptainer_fs>apptainer|singularity)/\d+)" + TAIL,
            Rank.UNIT,
            reason=_APPTAINER,
        ),
    ),
    build=_build,
    describe=_describe,
    short=_short,
    generic=2,
    named=False,
)
