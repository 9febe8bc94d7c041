"""The SSH transport: a pool of persistent asyncssh connections, one per node.

Output is read up to a cap: a node that prints more is a ``ProbeError`` (its answer unknown),
never buffered without end. A command given up on is sent TERM and its channel closed; the TERM
is a courtesy, since sshd passes no signal on and keeps the session's processes, which is why
the probe carries its own watchdog. Host keys are always verified against the configured
known_hosts, with deliberately no switch to turn that off. Nothing else in ``~/.ssh`` is
trusted: not its config, nor the X.509 CA bundle or certificate folder asyncssh would load.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from gpubot.config import SshSettings, expand
from gpubot.core.clock import within
from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.text import cut
from gpubot.errors import (
    AuthRefused,
    CommandTimeout,
    HostKeyRejected,
    NodeUnreachable,
    ProbeError,
    UsageError,
)
from gpubot.transport import descriptors
from gpubot.transport.boundary import ErrorMap, map_errors
from gpubot.transport.pool_cap import ConnectionCap
from gpubot.transport.sshlib import asyncssh

# OpenSSH's sshd allows 10 sessions per connection (MaxSessions); stay under it.
T = TypeVar("T")
MAX_CHANNELS = 8
# The most a command may print (stdout and stderr together). A probe of a busy 8-GPU node prints
# tens of KiB; one with hundreds of hostile processes, each at the probe's per-process cap, a few
# MiB. More than this is never read into memory: the node's answer is unknown.
MAX_OUTPUT_BYTES = 8 * 1024 * 1024


@dataclass
class _Pooled:
    conn: asyncssh.SSHClientConnection
    params: tuple[str, int, str | None, str | None]


def describe(argv: Sequence[str], limit: int = 60) -> str:
    """Return a short, one-line name of a command for messages."""
    if len(argv) > 3 and argv[0] in ("sh", "bash") and argv[1] == "-c":
        return argv[3]  # our scripts name themselves in $0 (gpubot-probe, ...)
    text = " ".join(shlex.join(argv).split())
    return cut(text, limit)


def exit_status_of(status: int | None, sig: tuple[str, bool, str, str] | None) -> int | None:
    """Return a shell-style exit status: the status, or 128 + the signal that ended it."""
    if status is not None and status >= 0:
        return status
    if sig:
        try:
            return 128 + int(signal.Signals[f"SIG{sig[0]}"])
        except KeyError:
            return 255
    return None


# AES-GCM first, then asyncssh's own order: its first choice, chacha20-poly1305, is several
# calls from Python per packet, AES-GCM one call into OpenSSL (benchmarks/README.md, "SSH
# ciphers"). A server that offers neither still gets every other default.
CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


class SshTransport:
    """Runs argv lists on nodes over pooled SSH connections (implements ``Transport``)."""

    def __init__(
        self,
        ssh: SshSettings,
        *,
        max_channels: int = MAX_CHANNELS,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        max_connections: int | None = None,
    ) -> None:
        """``max_connections``: the pool's cap (default: what the descriptor limit allows)."""
        self._ssh = ssh
        self._max_channels = max_channels
        self._max_output = max_output_bytes
        self._pool: dict[str, _Pooled] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._channels: dict[str, asyncio.Semaphore] = {}
        # Parsed once and shared by every connection, re-read when the file changes: parsing
        # known_hosts per connection cost CPU and memory that grew with the square of the fleet.
        self._files: dict[str, tuple[tuple[int, int, int], Any]] = {}
        self.connections_made = 0  # SSH connections opened so far (reconnects included)
        cap = descriptors.connection_cap() if max_connections is None else max_connections
        self._cap = ConnectionCap(cap, self._evict)

    def connected(self) -> int:
        return sum(1 for p in self._pool.values() if not p.conn.is_closed())

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` on ``node``, joined with ``shlex.join``."""
        async with self._cap.held(node.name, self._ssh.connect_timeout_s):
            return await self._run(node, argv, timeout=timeout)

    def _evict(self, name: str) -> None:  # to make room for another node's (pool_cap)
        pooled = self._pool.pop(name, None)
        if pooled is not None:
            pooled.conn.close()

    async def _run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        check_argv(argv)
        command = shlex.join(argv)
        limit = self._ssh.command_timeout_s if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit  # covers waiting for a session slot, opening it, running

        def left() -> float:
            return max(0.0, deadline - loop.time())

        no_slot: ErrorMap = {
            TimeoutError: (CommandTimeout, f"{describe(argv)}: no free SSH session in {limit:g}s")
        }
        for attempt in (1, 2):
            conn = await self._connection(node)  # bounded by the connect timeout
            slots = self._channels.setdefault(node.name, asyncio.Semaphore(self._max_channels))
            with map_errors(node.name, no_slot):
                await within(slots.acquire(), left())
            try:
                proc = await self._open(node, conn, command, left(), limit, retry=attempt == 1)
                if proc is None:
                    continue  # the pooled connection had died: nothing ran, connect again
                return await self._finish(node, conn, proc, argv, left(), limit)
            finally:
                slots.release()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _open(
        self,
        node: NodeConfig,
        conn: asyncssh.SSHClientConnection,
        command: str,
        left: float,
        limit: float,
        *,
        retry: bool,
    ) -> asyncssh.SSHClientProcess[bytes] | None:
        """Open a session running ``command``; None (with ``retry``) when the pooled connection
        died since its last use: nothing ran yet."""

        def refused(exc: BaseException) -> str:
            return f"cannot open an SSH session: {exc}"

        opening: ErrorMap = {
            TimeoutError: (
                NodeUnreachable,
                f"SSH connection stalled: no session opened in {limit:g}s",
            ),
            asyncssh.Error: (NodeUnreachable, refused),
            OSError: (NodeUnreachable, refused),
        }
        try:
            with map_errors(node.name, opening):
                return await within(
                    conn.create_process(command, stdin=asyncssh.DEVNULL, encoding=None), left
                )
        except NodeUnreachable as exc:
            stale = retry and _stale(conn, exc.__cause__)
            self._forget(node, conn)  # a connection that cannot open a channel is dead
            if stale:
                return None
            raise

    async def close(self) -> None:
        pooled, self._pool = list(self._pool.values()), {}
        for p in pooled:
            p.conn.close()
        for p in pooled:
            with contextlib.suppress(Exception):
                await within(p.conn.wait_closed(), 5)

    async def _finish(
        self,
        node: NodeConfig,
        conn: asyncssh.SSHClientConnection,
        proc: asyncssh.SSHClientProcess[bytes],
        argv: Sequence[str],
        left: float,
        limit: float,
    ) -> CommandResult:
        lost = f"connection lost during {describe(argv)}"
        reading: ErrorMap = {
            OutputCapped: (ProbeError, capped(argv, self._max_output)),
            TimeoutError: (
                CommandTimeout,
                f"{describe(argv)}: no answer in {limit:g}s (abandoned)",
            ),
            asyncssh.Error: (NodeUnreachable, lost),
            OSError: (NodeUnreachable, lost),
        }
        try:
            with map_errors(node.name, reading):
                out, err = await within(_collect(proc, self._max_output), left)
        except NodeUnreachable:
            self._forget(node, conn)
            raise
        except BaseException:  # given up on (the output cap, the deadline, a cancellation)
            _abandon(proc)
            raise
        status = exit_status_of(proc.exit_status, proc.exit_signal)
        if status is None:  # the channel closed without an exit status: connection lost
            self._forget(node, conn)
            raise NodeUnreachable(node.name, lost)
        return CommandResult(tuple(argv), status, out, err)

    async def _connection(self, node: NodeConfig) -> asyncssh.SSHClientConnection:
        params = (node.host, node.port, node.user, node.key)
        pooled = self._pool.get(node.name)
        if pooled and pooled.params == params and not pooled.conn.is_closed():
            return pooled.conn
        # One connect per node at a time: concurrent first calls share the connection.
        async with self._locks.setdefault(node.name, asyncio.Lock()):
            pooled = self._pool.get(node.name)
            if pooled and pooled.params == params and not pooled.conn.is_closed():
                return pooled.conn
            if pooled:
                self._forget(node, pooled.conn)
            conn = await self._connect(node)
            self._pool[node.name] = _Pooled(conn, params)
            return conn

    def _forget(self, node: NodeConfig, conn: asyncssh.SSHClientConnection) -> None:
        pooled = self._pool.get(node.name)
        if pooled and pooled.conn is conn:
            del self._pool[node.name]
        conn.close()

    def client_options(self, node: NodeConfig, known: asyncssh.SSHKnownHosts) -> dict[str, Any]:
        """Return the ``asyncssh.connect`` options for ``node``, host keys checked by ``known``."""
        options: dict[str, Any] = {
            # A callable (always truthy) so asyncssh never falls back to ~/.ssh/known_hosts.
            "known_hosts": lambda host, addr, port: known.match(host, addr, port),
            # No X.509 server certificates: asyncssh would trust ~/.ssh/ca-bundle.crt and the
            # hash folder ~/.ssh/crt by default. Host keys are trusted through known_hosts only.
            "x509_trusted_certs": None,
            "x509_trusted_cert_paths": [],
            "config": None,  # ignore ~/.ssh/config: the inventory says how to connect
            "connect_timeout": self._ssh.connect_timeout_s,
            "login_timeout": self._ssh.connect_timeout_s,
            "keepalive_interval": self._ssh.keepalive_s,
            "keepalive_count_max": 3,
            "password_auth": False,
            "kbdint_auth": False,
            "gss_auth": False,
            "gss_kex": False,
            "host_based_auth": False,
            "encryption_algs": CIPHERS,
        }
        if node.user:
            options["username"] = node.user
        if node.key:
            key_path = expand(node.key)

            def unloadable(exc: BaseException) -> str:
                return f"cannot load key {key_path}: {_why(exc)}"

            unusable: ErrorMap = {
                OSError: (AuthRefused, unloadable),
                asyncssh.KeyImportError: (AuthRefused, unloadable),
            }
            with map_errors(node.name, unusable):
                options["client_keys"] = [self._parsed(key_path, asyncssh.read_private_key)]
            options["agent_path"] = None
        return options

    def _parsed(self, path: str, parse: Callable[[str], T]) -> T:
        """Return ``parse(path)``, reused while the file's inode, mtime and size stay the same."""
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._files.get(path)
        if cached is not None and cached[0] == stamp:
            return cast(T, cached[1])  # stored by the same path's parse
        value = parse(path)
        self._files[path] = (stamp, value)
        return value

    async def _connect(self, node: NodeConfig) -> asyncssh.SSHClientConnection:
        known_path = expand(self._ssh.known_hosts)

        def unreadable(exc: BaseException) -> str:
            return f"cannot read known_hosts {known_path}: {_why(exc)}"

        with map_errors(
            node.name,
            {OSError: (HostKeyRejected, unreadable), ValueError: (HostKeyRejected, unreadable)},
        ):
            known = self._parsed(known_path, asyncssh.read_known_hosts)
        options = self.client_options(node, known)
        with map_errors(node.name, self._connecting(node, known, known_path)):
            conn = await asyncssh.connect(node.host, node.port, **options)
        self.connections_made += 1
        return conn

    def _connecting(
        self, node: NodeConfig, known: asyncssh.SSHKnownHosts, known_path: str
    ) -> ErrorMap:
        """Return what each failure of ``asyncssh.connect`` to ``node`` means, in one line."""
        where = f"{node.host}:{node.port}"

        def unverified(exc: BaseException) -> str:
            host_keys, ca_keys, *_ = known.match(node.host, "", node.port)
            if host_keys or ca_keys:
                return (
                    f"host key of {where} CHANGED: it does not match {known_path}; "
                    "refusing to connect (check the box, then update known_hosts)"
                )
            return (
                f"host key of {where} is unknown: not in {known_path}; "
                "refusing to connect (add it after checking its fingerprint)"
            )

        return {
            asyncssh.HostKeyNotVerifiable: (HostKeyRejected, unverified),
            asyncssh.PermissionDenied: (
                AuthRefused,
                lambda _: f"{where} refused our key for {node.user or getpass.getuser()}",
            ),
            TimeoutError: (
                NodeUnreachable,
                f"no SSH answer from {where} in {self._ssh.connect_timeout_s:g}s",
            ),
            OSError: (NodeUnreachable, lambda exc: f"cannot connect to {where}: {_reason(exc)}"),
            asyncssh.Error: (NodeUnreachable, lambda exc: f"SSH to {where} failed: {exc.reason}"),
        }


def _stale(conn: asyncssh.SSHClientConnection, cause: BaseException | None) -> bool:
    """Whether a session failed because the pooled connection had died, not stalled (a second
    try would not help a stalled one)."""
    if isinstance(cause, TimeoutError):
        return False
    return conn.is_closed() or isinstance(cause, asyncssh.DisconnectError | ConnectionError)


def _why(exc: BaseException) -> str:  # of a file that could not be read or parsed
    return getattr(exc, "strerror", None) or str(exc)


def _reason(exc: OSError) -> str:  # of a socket error ("Connection refused", DNS ...)
    if isinstance(exc, socket.gaierror) and exc.strerror:
        return exc.strerror
    if exc.errno and exc.errno > 0:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def check_argv(argv: Sequence[str]) -> None:
    """Refuse an argv that no exec can carry."""
    if not argv:
        raise UsageError("empty command")
    if any("\0" in a for a in argv):
        raise UsageError("a command argument contains a NUL byte")


class OutputCapped(Exception):
    """A command printed more than the transport reads."""


def capped(argv: Sequence[str], cap: int) -> str:
    """Return the one line a person sees for a command that printed more than ``cap`` bytes."""
    return (
        f"{describe(argv)} printed more than {cap // 1024} KiB: not read, so the node's answer is "
        "unknown (hundreds of processes with long names on it?)"
    )


class Readable(Protocol):
    """A stream read in chunks: asyncssh's SSHReader, asyncio's StreamReader."""

    async def read(self, n: int = -1) -> bytes: ...


async def read_capped(out: Readable, err: Readable, cap: int) -> tuple[str, str]:
    """Read both streams to their ends, at most ``cap`` bytes together; raise OutputCapped."""
    got = [0]

    async def drain(stream: Readable) -> bytes:
        parts: list[bytes] = []
        while chunk := await stream.read(65536):
            got[0] += len(chunk)
            if got[0] > cap:
                raise OutputCapped
            parts.append(chunk)
        return b"".join(parts)

    try:
        async with asyncio.TaskGroup() as tg:  # one stream over the cap ends the other's read
            o = tg.create_task(drain(out))
            e = tg.create_task(drain(err))
    except* OutputCapped:
        raise OutputCapped from None
    return o.result().decode("utf-8", "replace"), e.result().decode("utf-8", "replace")


async def _collect(proc: asyncssh.SSHClientProcess[bytes], cap: int) -> tuple[str, str]:
    out, err = await read_capped(proc.stdout, proc.stderr, cap)
    await proc.wait_closed()
    return out, err


def _abandon(proc: asyncssh.SSHClientProcess[bytes]) -> None:
    """Ask the remote command to stop (where the server honours signals), then close."""
    with contextlib.suppress(Exception):
        proc.terminate()
    with contextlib.suppress(Exception):
        proc.close()
