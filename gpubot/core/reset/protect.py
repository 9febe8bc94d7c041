"""Which processes gpubot never signals: daemons owned by the system, known by their executable.

A process names itself, so a name proves nothing; what it cannot change are its uids and the file
it runs (``/proc/PID/exe``). A process is protected only if its real and effective uid are a
configured system account's and its executable is a configured daemon path.

The probe reads ``exe`` only for a system-range account's process. Without root the exe of
another account's process is unreadable, so its argv[0] stands in: only that system account (or
root) can have written it, since a user cannot run a process with a system account's real and
effective uid.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.core.models import GpuProcess

DEFAULT_DAEMON_PATHS = (
    "/usr/bin/nvidia-persistenced",
    "/usr/bin/nv-hostengine",
    "/usr/bin/nv-fabricmanager",
    "/usr/bin/dcgm-exporter",
    "/usr/lib/xorg/Xorg",
    "/usr/libexec/Xorg",
    "/usr/bin/Xorg",
)
DEFAULT_SYSTEM_USERS = ("root", "nvidia-persistenced", "nvidia-dcgm")
_DELETED = " (deleted)"  # the exe after a package upgrade replaced the file


@dataclass(frozen=True)
class Protection:
    """The daemon executables (absolute paths) and the accounts they must run as."""

    paths: tuple[str, ...] = DEFAULT_DAEMON_PATHS
    system_users: tuple[str, ...] = DEFAULT_SYSTEM_USERS


def program(p: GpuProcess) -> str | None:
    """Return the executable ``p`` runs: ``/proc/PID/exe`` where readable, else its argv[0]."""
    path = p.exe if p.exe is not None else p.argv0
    return path.removesuffix(_DELETED) if path else None


def system_owned(p: GpuProcess, protection: Protection) -> bool:
    """Whether ``p``'s real and effective uid are one configured system account."""
    if p.uid is None or p.real_uid != p.uid:
        return False  # unknown, or a setuid program some user started
    return p.user in protection.system_users or (p.uid == 0 and "root" in protection.system_users)


def is_protected(p: GpuProcess, protection: Protection) -> bool:
    """Whether ``p`` is a system daemon gpubot leaves alone."""
    path = program(p)
    return (
        system_owned(p, protection)
        and path is not None
        and path.startswith("/")
        and path in protection.paths
    )
