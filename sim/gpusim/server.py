"""SSH servers for simulated nodes: what each is given, the pool both kinds are, and a mute port.

Both kinds are real SSH (``server_asyncssh``: asyncssh in-process; ``server_sshd``: OpenSSH
``sshd`` on loopback ports): host keys pinned in a known_hosts file, public-key login for one
user, and each command line run by the user's login shell (``shell -c COMMAND``), as ``sshd``
runs it. ``HungListener`` accepts TCP and never speaks SSH, for timeout tests.
"""

from __future__ import annotations

import errno
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpusim.errors import SimUsageError

STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ServerSpec:
    """What one node's SSH server needs."""

    name: str
    host_key: Path  # private key (OpenSSH format)
    authorized_keys: Path
    user: str
    home: str  # an existing directory: the sessions' working directory
    shell: str
    workdir: Path  # for sshd's config and log
    # Directories put before the standard PATH, in this order (the sudo stand-in's, the runtime
    # stand-ins').
    path_dirs: tuple[str, ...] = ()
    run_as: tuple[int, int] | None = None  # (uid, gid) sessions run as (asyncssh only; root)
    hidepid: bool = False  # each session's /proc is mounted hidepid=2 (asyncssh only)
    # Directories that replace the standard PATH (None: ``STD_PATH``): a node without programs.
    std_dirs: tuple[str, ...] | None = None


class ServerPool(Protocol):
    """Starts and stops the SSH servers of some nodes."""

    def start(self, spec: ServerSpec, port: int) -> int:
        """Serve ``spec`` on 127.0.0.1:``port`` (0: any free port); return the port."""
        ...

    def stop(self, name: str) -> None:
        """Stop serving node ``name`` and drop its connections."""
        ...

    def close(self) -> None:
        """Stop every server; kill what they started."""
        ...


def check_port_free(port: int) -> None:
    """Raise ``SimUsageError`` if 127.0.0.1:``port`` cannot be listened on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SimUsageError(f"port {port} on 127.0.0.1 is in use") from None
            raise SimUsageError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def client_argv(key: Path, known_hosts: Path, user: str, port: int, command: str) -> list[str]:
    """Return an OpenSSH client command line that runs ``command`` as ``user`` on 127.0.0.1's
    ``port``, with ``key`` only, trusting only the host keys in ``known_hosts``."""
    return [
        "ssh",
        "-i",
        str(key),
        "-p",
        str(port),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-F",
        "/dev/null",
        f"{user}@127.0.0.1",
        command,
    ]


def free_port() -> int:
    """Return a port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def session_path(spec: ServerSpec) -> str:
    """Return the PATH of a session: ``spec.path_dirs`` (if any), then the standard one."""
    for d in (*spec.path_dirs, *(spec.std_dirs or ())):
        if not d.startswith("/") or any(c in d for c in ':"\n\0'):
            raise SimUsageError(f"{spec.name}: bad directory for PATH: {d!r}")
    std = STD_PATH if spec.std_dirs is None else ":".join(spec.std_dirs)
    return ":".join([*spec.path_dirs, std])


def session_env(spec: ServerSpec) -> dict[str, str]:
    """Return the environment ``sshd`` gives a session of ``spec.user``."""
    return {
        "PATH": session_path(spec),
        "HOME": spec.home,
        "USER": spec.user,
        "LOGNAME": spec.user,
        "SHELL": spec.shell,
    }


# ---- a port that accepts and never answers --------------------------------------------------


class HungListener:
    """Accept TCP connections on 127.0.0.1:``port`` and never send a byte."""

    def __init__(self, port: int) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("127.0.0.1", port))
        except OSError:
            self._sock.close()
            raise SimUsageError(f"port {port} on 127.0.0.1 is in use") from None
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpusim-hung", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        """Stop listening and drop the held connections."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
        for c in self._held:
            c.close()
        self._held.clear()
