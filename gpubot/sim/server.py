"""SSH servers for simulated nodes: asyncssh in-process, or OpenSSH ``sshd`` on loopback ports.

Both are real SSH: host keys pinned in a known_hosts file, public-key login for one user, and
each command line run by the user's login shell (``shell -c COMMAND``), as ``sshd`` runs it.
A third kind of endpoint accepts TCP and never speaks SSH, for timeout tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import asyncssh

from gpubot.errors import SimError, UsageError
from gpubot.sim import simstate

T = TypeVar("T")
SSHD = "/usr/sbin/sshd"
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
    """Raise ``UsageError`` if 127.0.0.1:``port`` cannot be listened on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on 127.0.0.1 is in use") from None
            raise UsageError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def free_port() -> int:
    """Return a port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Run as root in a fresh mount namespace: mount /proc hidepid=2, then become the session's user.
_HIDEPID = (
    "mount -t proc -o hidepid=2 proc /proc || exit 126; uid=$1 gid=$2; shift 2; "
    'exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"'
)


def session_path(spec: ServerSpec) -> str:
    """Return the PATH of a session: ``spec.path_dirs`` (if any), then the standard one."""
    for d in spec.path_dirs:
        if not d.startswith("/") or any(c in d for c in ':"\n\0'):
            raise UsageError(f"{spec.name}: bad directory for PATH: {d!r}")
    return ":".join([*spec.path_dirs, STD_PATH])


def session_env(spec: ServerSpec) -> dict[str, str]:
    """Return the environment ``sshd`` gives a session of ``spec.user``."""
    return {
        "PATH": session_path(spec),
        "HOME": spec.home,
        "USER": spec.user,
        "LOGNAME": spec.user,
        "SHELL": spec.shell,
    }


# ---- asyncssh -------------------------------------------------------------------------------


@dataclass
class _Listener:
    spec: ServerSpec
    authorized: asyncssh.SSHAuthorizedKeys
    acceptor: asyncssh.SSHAcceptor | None = None
    conns: set[asyncssh.SSHServerConnection] = field(default_factory=set)


class _Server(asyncssh.SSHServer):
    def __init__(self, lst: _Listener) -> None:
        self._lst = lst
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._lst.conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._lst.conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        # Only the configured user has keys; anyone else is refused like sshd's AllowUsers.
        if username == self._lst.spec.user and self._conn is not None:
            self._conn.set_authorized_keys(self._lst.authorized)
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False


class AsyncsshPool:
    """Every node's asyncssh server, on one event loop in a background thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gpusim-asyncssh", daemon=True
        )
        self._thread.start()
        self._listeners: dict[str, _Listener] = {}
        self._children: set[asyncio.subprocess.Process] = set()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, spec: ServerSpec, port: int) -> int:
        """Serve ``spec`` on 127.0.0.1:``port`` (0: any free port); return the port."""
        return self._call(self._start(spec, port))

    async def _start(self, spec: ServerSpec, port: int) -> int:
        lst = _Listener(spec, asyncssh.read_authorized_keys(str(spec.authorized_keys)))
        key = asyncssh.read_private_key(str(spec.host_key))

        async def handle(process: asyncssh.SSHServerProcess[bytes]) -> None:
            await self._session(lst, process)

        try:
            lst.acceptor = await asyncssh.listen(
                "127.0.0.1",
                port,
                server_factory=lambda: _Server(lst),
                server_host_keys=[key],
                process_factory=handle,
                encoding=None,
                reuse_address=True,
                agent_forwarding=False,
                x11_forwarding=False,
                allow_scp=False,
                login_timeout=30,
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on 127.0.0.1 is in use") from None
            raise SimError(f"{spec.name}: cannot listen on 127.0.0.1:{port}: {exc}") from None
        self._listeners[spec.name] = lst
        return int(lst.acceptor.get_port())

    def stop(self, name: str) -> None:
        """Stop serving node ``name`` and drop its connections."""
        self._call(self._stop(name))

    async def _stop(self, name: str) -> None:
        lst = self._listeners.pop(name, None)
        if lst is None:
            return
        if lst.acceptor is not None:
            lst.acceptor.close()
            await lst.acceptor.wait_closed()
        for conn in list(lst.conns):
            conn.abort()  # like a box going away: no goodbye
        await asyncio.sleep(0)

    def close(self) -> None:
        """Stop every server, kill the commands still running, and end the loop thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all(), timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_all(self) -> None:
        for name in list(self._listeners):
            await self._stop(name)
        for proc in list(self._children):
            _killpg(proc.pid)
        if self._children:
            await asyncio.wait([asyncio.ensure_future(p.wait()) for p in self._children], timeout=5)

    async def _session(self, lst: _Listener, process: asyncssh.SSHServerProcess[bytes]) -> None:
        spec = lst.spec
        cmd = process.command
        # sshd hands the command line to the user's login shell: so do we.
        argv = [spec.shell, "-c", cmd] if cmd is not None else [spec.shell]
        who: dict[str, Any] = {}
        if spec.run_as is not None and spec.hidepid:
            # A private mount namespace whose /proc hides other users' processes, then the user.
            argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", _HIDEPID,
                    "gpusim-session", str(spec.run_as[0]), str(spec.run_as[1]), *argv]  # fmt: skip
        elif spec.run_as is not None:
            who = {"user": spec.run_as[0], "group": spec.run_as[1], "extra_groups": []}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=spec.home,
                env=session_env(spec),
                start_new_session=True,  # its own process group, killed as one on disconnect
                **who,
            )
        except OSError as exc:
            process.stderr.write(f"{spec.shell}: {exc.strerror}\n".encode())
            process.exit(127)
            return
        self._children.add(proc)
        assert proc.stdout is not None and proc.stderr is not None
        feeder = asyncio.ensure_future(_feed(process, proc))
        pumps = asyncio.ensure_future(
            asyncio.gather(_pump(proc.stdout, process.stdout), _pump(proc.stderr, process.stderr))
        )
        closed = asyncio.ensure_future(process.channel.wait_closed())
        waiters: list[asyncio.Future[Any]] = [pumps, closed]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if pumps.done() and pumps.exception() is None:
                rc = await proc.wait()
                if rc < 0:
                    process.exit_with_signal(signal.Signals(-rc).name.removeprefix("SIG"))
                else:
                    process.exit(rc)
        finally:
            if proc.returncode is None:  # the client went away: end what it started
                _killpg(proc.pid)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
            for task in (feeder, closed, pumps):
                if not task.done():
                    task.cancel()
            await asyncio.gather(feeder, closed, pumps, return_exceptions=True)
            self._children.discard(proc)


async def _pump(src: asyncio.StreamReader, dst: asyncssh.SSHWriter[bytes]) -> None:
    while True:
        data = await src.read(65536)
        if not data:
            return
        dst.write(data)
        await dst.drain()


async def _feed(
    process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
) -> None:
    assert proc.stdin is not None
    try:
        while True:
            data = await process.stdin.read(65536)
            if not data:
                break
            proc.stdin.write(data)
            await proc.stdin.drain()
    except (OSError, asyncssh.Error):
        pass
    finally:
        with contextlib.suppress(Exception):
            proc.stdin.close()


def _killpg(pgid: int) -> None:
    """Kill the process group that one session started (its leader is our own child)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ---- OpenSSH sshd ---------------------------------------------------------------------------


@dataclass
class _Sshd:
    proc: subprocess.Popen[bytes]
    ticks: int
    port: int


class SshdPool:
    """One OpenSSH ``sshd -D`` per node, listening on 127.0.0.1 only."""

    def __init__(self, reap: Any) -> None:
        self._daemons: dict[str, _Sshd] = {}
        self._reap = reap
        if not os.access(SSHD, os.X_OK):
            raise SimError(f"{SSHD} not found: install openssh-server or use server='asyncssh'")
        if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
            # sshd started by root insists on its privilege-separation directory.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

    def start(self, spec: ServerSpec, port: int) -> int:
        """Serve ``spec`` on 127.0.0.1:``port`` (0: any free port); return the port."""
        for _attempt in range(5 if port == 0 else 1):
            chosen = port or free_port()
            if port:
                check_port_free(port)
            config = spec.workdir / "sshd_config"
            config.write_text(sshd_config(spec, chosen), encoding="utf-8")
            log = spec.workdir / "sshd.log"
            with open(log, "ab") as lf:
                proc = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=lf,
                    stderr=lf,
                    start_new_session=True,
                )
            if _wait_listening(chosen, proc, 10.0):
                self._daemons[spec.name] = _Sshd(proc, simstate.start_ticks(proc.pid) or 0, chosen)
                return chosen
            proc.kill()
            proc.wait()
            lines = log.read_text(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "no output"
            if port == 0 and "Address already in use" in last:
                continue
            raise SimError(f"{spec.name}: sshd did not start: {last}")
        raise SimError(f"{spec.name}: sshd found no free port")

    def stop(self, name: str) -> None:
        """Stop node ``name``'s sshd and kill its sessions (and what they run)."""
        d = self._daemons.pop(name, None)
        if d is None:
            return
        family = descendants(d.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            _signal_if(d.proc.pid, d.ticks, signal.SIGKILL)
        for pid, ticks in family:
            _signal_if(pid, ticks, signal.SIGKILL)
        d.proc.wait()
        deadline = time.monotonic() + 3
        left = family
        while left and time.monotonic() < deadline:
            for pid, _ in left:  # orphans come to us (a child subreaper): reap them
                self._reap(pid)
            left = [(p, t) for p, t in left if simstate.start_ticks(p) == t]
            if left:
                time.sleep(0.02)

    def close(self) -> None:
        """Stop every sshd."""
        for name in list(self._daemons):
            self.stop(name)


def sshd_config(spec: ServerSpec, port: int) -> str:
    """Return an sshd_config that serves one node on 127.0.0.1:``port``."""
    # SetEnv overrides the PATH that sshd gives every session (its own default, ~/.ssh/environment).
    env = [f'SetEnv "PATH={session_path(spec)}"'] if spec.path_dirs else []
    return "\n".join(
        [
            *env,
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            "AddressFamily inet",
            f"HostKey {spec.host_key}",
            f"AuthorizedKeysFile {spec.authorized_keys}",
            f"AllowUsers {spec.user}",
            "PidFile none",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",  # the fleet lives under /tmp, whose modes StrictModes rejects
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "PermitTTY yes",
            "MaxStartups 200",
            "MaxSessions 200",
            "LoginGraceTime 30",
            "LogLevel ERROR",
            "",
        ]
    )


def descendants(root: int) -> list[tuple[int, int]]:
    """Return ``(pid, start ticks)`` of every descendant of ``root`` (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = simstate.proc_stat(int(entry))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry))
    out: list[tuple[int, int]] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        ticks = simstate.start_ticks(pid)
        if ticks is not None:
            out.append((pid, ticks))
        todo += children.get(pid, [])
    return out


def _signal_if(pid: int, ticks: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process started at ``ticks``."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if simstate.start_ticks(pid) != ticks:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.02)
    return False


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
            raise UsageError(f"port {port} on 127.0.0.1 is in use") from None
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
