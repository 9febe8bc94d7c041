"""Every simulated node's SSH server as an asyncssh server, on one event loop in its own thread."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpusim.errors import SimError, SimUsageError
from gpusim.server import ServerSpec, session_env
from gpusim.sshlib import asyncssh

T = TypeVar("T")
_SESSION_END_S = 5.0  # how long a session's ended command has to exit and close its pipes

# Run as root in a fresh mount namespace: mount /proc hidepid=2, then become the session's user.
_HIDEPID = (
    "mount -t proc -o hidepid=2 proc /proc || exit 126; uid=$1 gid=$2; shift 2; "
    'exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"'
)


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
        self._sessions: set[asyncio.Task[Any]] = set()
        self.execs: Counter[str] = Counter()  # commands each node's server was asked to run

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, spec: ServerSpec, port: int) -> int:
        """Serve ``spec`` on 127.0.0.1:``port`` (0: any free port); return the port."""
        return self._call(self._start(spec, port))

    async def _start(self, spec: ServerSpec, port: int) -> int:
        lst = _Listener(spec, asyncssh.read_authorized_keys(str(spec.authorized_keys)))
        key = asyncssh.read_private_key(str(spec.host_key))

        async def handle(process: asyncssh.SSHServerProcess[bytes]) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._sessions.add(task)  # closing the pool waits for it to end its command
            self.execs[spec.name] += 1
            try:
                await self._session(lst, process)
            finally:
                self._sessions.discard(task)

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
                raise SimUsageError(f"port {port} on 127.0.0.1 is in use") from None
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
            self._call(self._close_all(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_all(self) -> None:
        for name in list(self._listeners):
            await self._stop(name)
        for proc in list(self._children):
            _killpg(proc.pid)
        # Each session reaps its own command and closes its pipes (below); the loop must not
        # stop under one that has not yet, or its task is destroyed pending, pipes open.
        if self._sessions:
            await asyncio.wait(list(self._sessions), timeout=_SESSION_END_S + 5)

    async def _session(self, lst: _Listener, process: asyncssh.SSHServerProcess[bytes]) -> None:
        spec = lst.spec
        argv, who = _session_command(spec, process.command)
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
        each = [
            asyncio.ensure_future(_pump(proc.stdout, process.stdout)),
            asyncio.ensure_future(_pump(proc.stderr, process.stderr)),
        ]
        pumps = asyncio.gather(*each)  # done at the first pump's error: the other still reads
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
            tasks: list[asyncio.Future[Any]] = [feeder, closed, pumps, *each]
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await _reap(proc)
            self._children.discard(proc)


def _session_command(spec: ServerSpec, cmd: str | None) -> tuple[list[str], dict[str, Any]]:
    """Return how a session runs ``cmd`` (None: an interactive shell): its argv, and the
    ``user``/``group`` options of the process when it runs as another user."""
    # sshd hands the command line to the user's login shell: so do we.
    argv = [spec.shell, "-c", cmd] if cmd is not None else [spec.shell]
    if spec.run_as is not None and spec.hidepid:
        # A private mount namespace whose /proc hides other users' processes, then the user.
        return [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            _HIDEPID,
            "gpusim-session",
            str(spec.run_as[0]),
            str(spec.run_as[1]),
            *argv,
        ], {}
    if spec.run_as is not None:
        return argv, {"user": spec.run_as[0], "group": spec.run_as[1], "extra_groups": []}
    return argv, {}


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Read what is left of an ended session's output to its end (discarded) and wait for it.

    A pump stopped in a full channel (a client that stopped reading) leaves its pipe short of
    EOF, buffered past asyncio's pause mark: unread, it stays open until this process exits. A
    process of the command's left running outside its group (or the shell's background job, the
    shell gone) may hold the pipe for good: after ``_SESSION_END_S`` the pipes are closed."""
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(_SESSION_END_S):
            await asyncio.gather(_discard(proc.stdout), _discard(proc.stderr), proc.wait())
    except (TimeoutError, OSError):
        transport = getattr(proc, "_transport", None)  # asyncio's: no public way to close it
        if transport is not None:
            transport.close()


async def _discard(src: asyncio.StreamReader) -> None:
    while await src.read(65536):
        pass


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
