"""Which processes gpubot never signals: daemons owned by the system, known by their executable.

A process names itself (argv, comm) and a user can call a job anything, so a name proves nothing.
What a process cannot change about itself: its uids (``/proc/PID/status``) and the file it runs
(``/proc/PID/exe``). A process is protected only if both its real and effective uid belong to a
configured system account and its executable is one of the configured daemon paths.

The probe reads ``/proc/PID/exe`` only for processes of a system-range account (uid < 1000,
real = effective); a system account with a higher uid is judged by its argv[0] as below.
``/proc/PID/exe`` of another account's process is readable only by root. Where gpubot reads a node
without root (``sudo = true`` nodes), the exe of a system process is unknown; its argv[0] stands in,
which only that system account (or root) can have written: a user cannot make a process that runs
with a system account's real and effective uid.
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
    """Whether ``p`` is a system daemon gpubot leaves alone (see the module's docstring)."""
    path = program(p)
    return (
        system_owned(p, protection)
        and path is not None
        and path.startswith("/")
        and path in protection.paths
    )
