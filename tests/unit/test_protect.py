"""core/protect: a system daemon is known by its owner's uids and its executable, never its name."""

from __future__ import annotations

import pytest

from gpubot.core.models import GpuProcess
from gpubot.core.reset.protect import (
    DEFAULT_DAEMON_PATHS,
    DEFAULT_SYSTEM_USERS,
    Protection,
    is_protected,
    program,
    system_owned,
)

PERSISTENCED = "/usr/bin/nvidia-persistenced"
DEFAULT = Protection()


def proc(
    user: str | None = "root",
    uid: int | None = 0,
    real_uid: int | None = 0,
    exe: str | None = PERSISTENCED,
    argv0: str | None = PERSISTENCED,
    name: str = "nvidia-persiste",
) -> GpuProcess:
    return GpuProcess(
        pid=812,
        gpu_index=0,
        used_memory_mib=None,
        process_name=name,
        visible_to_nvidia_smi=False,
        holds_device_file=True,
        user=user,
        start_ticks=100,
        command=argv0,
        uid=uid,
        real_uid=real_uid,
        exe=exe,
        argv0=argv0,
    )


CASES = [
    ("root + the daemon's exe", proc(), True),
    ("alice running the daemon's exe", proc("alice", 1000, 1000), False),
    (
        "alice's job with the exe path in argv0, exe unreadable",
        proc("alice", 1000, 1000, exe=None),
        False,
    ),
    (
        "root, only the name right (argv0 bare, exe unknown)",
        proc(exe=None, argv0="nvidia-persistenced"),
        False,
    ),
    (
        "root, only comm right",
        proc(exe="/tmp/x", argv0="/tmp/x", name="nvidia-persistenced"),
        False,
    ),
    (
        "root, exe elsewhere though argv0 says the daemon",
        proc(exe="/tmp/nvidia-persistenced"),
        False,
    ),
    ("setuid: started by uid 1000, runs as root", proc(real_uid=1000), False),
    ("setuid the other way: real root, effective alice", proc("alice", 1000, 0), False),
    (
        "system user nvidia-persistenced, exe unreadable: argv0 path stands in",
        proc("nvidia-persistenced", 990, 990, exe=None),
        True,
    ),
    (
        "system user, exe unreadable, argv0 a bare name",
        proc("nvidia-persistenced", 990, 990, exe=None, argv0="nvidia-persistenced"),
        False,
    ),
    (
        "system user, exe unreadable, no argv0",
        proc("nvidia-persistenced", 990, 990, exe=None, argv0=None),
        False,
    ),
    (
        "system user, exe unreadable, empty argv0",
        proc("nvidia-persistenced", 990, 990, exe=None, argv0=""),
        False,
    ),
    ("exe replaced by a package upgrade", proc(exe=PERSISTENCED + " (deleted)"), True),
    (
        "argv0 with the deleted suffix",
        proc("nvidia-dcgm", 991, 991, exe=None, argv0="/usr/bin/nv-hostengine (deleted)"),
        True,
    ),
    ("a suffix that only looks alike", proc(exe=PERSISTENCED + " (deleted)x"), False),
    ("unknown uid", proc(uid=None, real_uid=None), False),
    ("unknown uid, real uid 0", proc(uid=None, real_uid=0), False),
    ("unknown real uid", proc(real_uid=None), False),
    ("uid 0 whose name /proc could not map", proc(user=None), True),
    ("uid 0 shown as digits", proc(user="0"), True),
    ("the daemon's path with a trailing slash", proc(exe=PERSISTENCED + "/"), False),
    ("another configured daemon, Xorg", proc(exe="/usr/lib/xorg/Xorg", argv0="Xorg"), True),
    ("a path not configured", proc(exe="/usr/bin/python3", argv0="python3"), False),
]


@pytest.mark.parametrize(("what", "p", "want"), CASES, ids=[c[0] for c in CASES])
def test_is_protected_table(what: str, p: GpuProcess, want: bool) -> None:
    assert is_protected(p, DEFAULT) is want


def test_defaults() -> None:
    assert DEFAULT.paths == DEFAULT_DAEMON_PATHS and DEFAULT.system_users == DEFAULT_SYSTEM_USERS
    assert all(path.startswith("/") for path in DEFAULT_DAEMON_PATHS)
    assert "root" in DEFAULT_SYSTEM_USERS


def test_root_counts_only_while_root_is_configured() -> None:
    no_root = Protection(system_users=("nvidia-persistenced",))
    assert not is_protected(proc(), no_root)
    assert not is_protected(proc(user=None), no_root)
    assert is_protected(proc("nvidia-persistenced", 990, 990), no_root)


def test_only_configured_paths() -> None:
    custom = Protection(paths=("/opt/dcgm/bin/nv-hostengine",))
    assert not is_protected(proc(), custom)
    assert is_protected(proc(exe="/opt/dcgm/bin/nv-hostengine"), custom)
    # a bare name (config refuses one) does not match a daemon known by its path
    assert not is_protected(proc(), Protection(paths=("nvidia-persistenced",)))
    assert not is_protected(proc(), Protection(paths=()))
    assert not is_protected(proc(), Protection(system_users=()))


@pytest.mark.parametrize(
    ("exe", "argv0", "want"),
    [
        (PERSISTENCED, "whatever", PERSISTENCED),  # the exe wins over what argv0 says
        (None, PERSISTENCED, PERSISTENCED),
        (PERSISTENCED + " (deleted)", None, PERSISTENCED),
        (None, None, None),
        (None, "", None),
        ("", PERSISTENCED, None),  # an exe read as empty is not replaced by argv0
    ],
)
def test_program(exe: str | None, argv0: str | None, want: str | None) -> None:
    assert program(proc(exe=exe, argv0=argv0)) == want


def test_system_owned() -> None:
    assert system_owned(proc(), DEFAULT)
    assert system_owned(proc("nvidia-dcgm", 991, 991), DEFAULT)
    assert not system_owned(proc("alice", 1000, 1000), DEFAULT)
    assert not system_owned(proc(real_uid=1000), DEFAULT)
    assert not system_owned(proc(uid=None, real_uid=None), DEFAULT)
