"""The host side of a simulated fleet: its options, its files, its Python and library, reaping."""

from __future__ import annotations

import compileall
import contextlib
import ctypes
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpusim.errors import SimError, SimUsageError
from gpusim.inventory import RUNTIMES
from gpusim.sudoers import parse_sudoers

# The standalone modules (standard library only) that nodes run as ``gpusim.*``.
STANDALONE = (
    "simstate.py",
    "nvidia_smi.py",
    "smi_faults.py",
    "smi_health.py",
    "workload.py",
    "sudo.py",
    "sudoers.py",
    "runtimes.py",
    "runtime_registry.py",
    "containers.py",
    "jobs.py",
    "kernlog.py",
)
PR_SET_CHILD_SUBREAPER = 36
SERVERS = ("asyncssh", "sshd")


def node_python() -> str:
    """Return the Python that nodes run: the system's (other users can run it), else ours."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def usable_python(python: str) -> str:
    """Return ``python`` if it runs the standalone modules (3.10 or later), else ours."""
    probe = subprocess.run(
        [python, "-S", "-c", "import sys; sys.exit(sys.version_info < (3, 10))"],
        capture_output=True,
    )
    return python if probe.returncode == 0 else sys.executable


def choose_root(directory: Path) -> Path | None:
    """Return a fresh directory for the nodes when others cannot reach ``directory``, else None.

    The fresh one is linked as ``directory/fleet``; whoever gets it removes it.
    """
    if os.geteuid() != 0 or traversable(directory):
        return None
    # Workloads of other users (and their Python) must reach the node files: the given
    # directory is private (like pytest's), so the nodes live in a world-traversable one.
    root = Path(tempfile.mkdtemp(prefix="gpusim-", dir="/tmp"))
    os.chmod(root, 0o755)
    link = directory / "fleet"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(root)
    return root


def write_lib(lib_dir: Path) -> None:
    """Copy the standalone modules to ``lib_dir/gpusim/`` with a workload launcher; all readable."""
    pkg = lib_dir / "gpusim"
    pkg.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    (pkg / "__init__.py").write_text('"""Standalone parts of gpusim."""\n')
    for name in STANDALONE:
        shutil.copyfile(here / name, pkg / name)
    (lib_dir / "gpusim_workload.py").write_text(
        "import sys\n\nfrom gpusim.workload import main\n\nsys.exit(main())\n"
    )
    # Compiled once here: every nvidia-smi, journalctl and workload of the node imports these,
    # and a Python that may not write bytecode (PYTHONDONTWRITEBYTECODE, or a user who cannot
    # write here) would compile them again at each start (a quarter of nvidia-smi's CPU).
    compileall.compile_dir(pkg, quiet=1)
    for p in [lib_dir, pkg, *lib_dir.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def traversable(path: Path) -> bool:
    """Tell whether every user may traverse ``path`` and all its parents."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def become_subreaper() -> None:
    """Adopt orphaned descendants (a killed supervisor's child) so that we can reap them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    except (OSError, AttributeError) as exc:
        raise SimError(f"cannot become a child subreaper: {exc}") from None


def account(view_user: str | None) -> pwd.struct_passwd:
    """Return the account SSH sessions log in as: ``view_user``, or the effective user."""
    try:
        return pwd.getpwnam(view_user) if view_user else pwd.getpwuid(os.geteuid())
    except KeyError:
        raise SimUsageError(f"no such user {view_user!r}") from None


def home_and_shell(pw: pwd.struct_passwd) -> tuple[str, str]:
    """Return the sessions' home (``/`` if missing) and shell (``/bin/sh`` if it is no login)."""
    home = pw.pw_dir if pw.pw_dir and os.path.isdir(pw.pw_dir) else "/"
    shell = pw.pw_shell
    ok = shell and os.access(shell, os.X_OK) and not shell.endswith(("nologin", "false"))
    return home, shell if ok else "/bin/sh"


def runtime_options(
    runtimes: bool | Sequence[str], session_path: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Check ``SimFleet``'s ``runtimes`` and ``session_path``; return what the inventory lists
    and the directories put first on a session's PATH (``SimUsageError`` for a bad value)."""
    return runtime_names(runtimes, RUNTIMES), path_dirs(session_path)


def runtime_names(runtimes: bool | Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    """Return the runtimes the inventory lists: all ``known`` for True, none for False, else
    the names given (each one of ``known``); ``SimUsageError`` for anything else."""
    if isinstance(runtimes, bool):
        return tuple(known) if runtimes else ()
    if isinstance(runtimes, str) or not all(r in known for r in runtimes) or not runtimes:
        raise SimUsageError(
            f"runtimes must be True, False or names from {list(known)}: {runtimes!r}"
        )
    return tuple(dict.fromkeys(runtimes))


def paths(what: str, given: Sequence[str]) -> tuple[str, ...]:
    """Return ``given`` (a list of paths) as a tuple; ``SimUsageError`` for a lone string."""
    if isinstance(given, str):
        raise SimUsageError(f"{what} must be a list of paths, not {given!r}")
    return tuple(given)


def sudo_rule(text: str | None) -> dict[str, Any] | None:
    """Return the parsed sudoers block ``text`` (None for none); ``SimUsageError`` if bad."""
    try:
        return None if text is None else parse_sudoers(text)
    except ValueError as exc:
        raise SimUsageError(f"sudo rule: {exc}") from None


def path_dirs(dirs: Sequence[str]) -> tuple[str, ...]:
    """Return ``dirs`` (for a session's PATH) as absolute paths; ``SimUsageError`` for a bad one."""
    if isinstance(dirs, str):
        raise SimUsageError(f"session_path must be a list of directories, not {dirs!r}")
    out = tuple(str(d) for d in dirs)
    for d in out:
        if not os.path.isabs(d) or ":" in d or not os.path.isdir(d):
            raise SimUsageError(f"session_path: not an absolute directory for PATH: {d!r}")
    return out


def check_options(
    *,
    nodes: Any,
    gpus: Any,
    server: str,
    release_delay_s: Any,
    model: str,
    memory_mib: Any,
    base_port: int | None,
    minors: Sequence[int] | None,
    view_user: str | None,
    hidepid: bool,
) -> None:
    """Raise ``SimUsageError`` for ``SimFleet`` options that make no fleet."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 64:
        raise SimUsageError(f"nodes must be 1-64, not {nodes!r}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
        raise SimUsageError(f"gpus must be 1-64, not {gpus!r}")
    if minors is not None and sorted(minors) != list(range(gpus)):
        raise SimUsageError(f"minors must be a permutation of 0-{gpus - 1}, not {minors!r}")
    if server not in SERVERS:
        raise SimUsageError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
    if isinstance(release_delay_s, bool) or not isinstance(release_delay_s, int | float):
        raise SimUsageError(f"release delay must be a number, not {release_delay_s!r}")
    if release_delay_s < 0:
        raise SimUsageError(f"release delay must be >= 0 s, not {release_delay_s}")
    if not model or "," in model or "\n" in model:
        raise SimUsageError(f"bad GPU model name {model!r}")
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib < 1:
        raise SimUsageError(f"memory must be a positive number of MiB, not {memory_mib!r}")
    if base_port is not None and not 1 <= base_port <= 65536 - nodes:
        raise SimUsageError(f"base port {base_port} leaves no room for {nodes} nodes")
    if (view_user or hidepid) and server != "asyncssh":
        raise SimUsageError("view_user and hidepid need the asyncssh server")
    if hidepid and not view_user:
        raise SimUsageError("hidepid needs view_user: root sees every process anyway")
    if view_user is not None and os.geteuid() != 0:
        raise SimUsageError("view_user needs root (to start sessions as another user)")


STD_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def write_std_bin(folder: Path, without: Sequence[str]) -> None:
    """Fill ``folder`` with links to every program of the standard PATH but those named in
    ``without`` (the first of each name, as PATH finds it): the PATH of a node lacking them."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    for d in STD_DIRS:
        with contextlib.suppress(OSError):
            for entry in os.scandir(d):
                link = folder / entry.name
                if entry.name in without or link.is_symlink() or "\n" in entry.name:
                    continue
                if entry.is_file() and os.access(entry.path, os.X_OK):
                    link.symlink_to(entry.path)


def program_names(without: Sequence[str]) -> tuple[str, ...]:
    """Return ``without`` (names of programs the nodes lack); ``SimUsageError`` for a bad one."""
    if isinstance(without, str):
        raise SimUsageError(f"without must be a list of program names, not {without!r}")
    for name in without:
        if not name or "/" in name or name in (".", ".."):
            raise SimUsageError(f"without: bad program name {name!r}")
    return tuple(without)
