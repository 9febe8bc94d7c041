"""systemd: system services, and users' login sessions and managers (systemd.special(7)).

Cgroup shapes: a service ``/system.slice/[SUB.slice/]UNIT.service``; a session
``/user.slice/user-UID.slice/session-N.scope``, a user's manager ``.../user@UID.service``.
Without pam_systemd every login or cron job stays in the unit of the daemon that started it:
stopping that unit would end sshd or cron (and everyone's sessions), so those units are no
workload. A service comes last among all shapes: a container's or job's shape, or a runtime's
own unit, wins over it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpubot.core import text
from gpubot.core.runtimes.base import (
    ROOT_SLICES,
    TAIL,
    Rank,
    Runtime,
    Shape,
    Workload,
    always,
)

_LOGIN = r"ssh|sshd|openssh-server|cron|crond|cronie|anacron|atd|xrdp|xrdp-sesman"
_UNIT_OK = re.compile(r"[A-Za-z0-9:_.@-]+\.service")


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    return Workload(kind, g["unit"]).with_detail(uid=g.get("uid"))


def _describe_service(w: Workload) -> str:
    return f"systemd service {text.code(w.id)}"


def _describe_session(w: Workload) -> str:
    uid = w.get("uid")  # digits only (the cgroup shape)
    return f"login session {text.code(w.id)}" + (f" of uid {uid}" if uid else "")


def _stop(w: Workload) -> list[str] | None:
    return ["systemctl", "stop", w.id] if _UNIT_OK.fullmatch(w.id) else None


def _is_unit(w: Workload, comp: str, prev: str) -> bool:
    return comp == w.id


SERVICE = Runtime(
    kind="service",
    shapes=(
        Shape(
            rf"{ROOT_SLICES}(?P<reason_login>(?:{_LOGIN})\.service|(?:serial-)?getty@[^/]+\.service)"
            + TAIL,
            Rank.UNIT,
            reason="a login or cron daemon's own unit: it holds other users' sessions too",
        ),
        Shape(
            r"/system\.slice/(?:[^/]+\.slice/)*(?P<unit>[A-Za-z0-9:_.@\\-]+\.service)" + TAIL,
            Rank.SERVICE,
        ),
    ),
    build=_build,
    describe=_describe_service,
    stop=_stop,
    sudo_stop="systemctl stop *",
    restarts=always,
    is_root=_is_unit,
    noun="unit `{}`",
    generic=1,
)

SESSION = Runtime(
    kind="session",
    shapes=(
        Shape(
            r"/user\.slice/user-(?P<uid>\d+)\.slice/(?P<unit>session-[0-9a-z]+\.scope)" + TAIL,
            Rank.SESSION,
        ),
        Shape(
            r"/user\.slice/user-(?P<uid>\d+)\.slice/(?P<unit>user@\d+\.service)" + TAIL,
            Rank.SESSION,
        ),
    ),
    build=_build,
    describe=_describe_session,
    generic=1,
    named=False,  # a bare login session: the process's user says it all
)
