"""Every simulated node's SSH server as one OpenSSH ``sshd -D`` on a loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from gpusim import simstate
from gpusim.errors import SimError
from gpusim.server import ServerSpec, check_port_free, free_port, session_path

SSHD = "/usr/sbin/sshd"


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
            simstate.signal_if(d.proc.pid, d.ticks, signal.SIGKILL)
        for pid, ticks in family:
            simstate.signal_if(pid, ticks, signal.SIGKILL)
        d.proc.wait()
        deadline = time.monotonic() + 3
        left = family
        while left and time.monotonic() < deadline:
            for pid, _ in left:  # orphans come to us (a child subreaper): reap them
                self._reap(pid)
            left = [(p, t) for p, t in left if simstate.start_ticks(p) == t]
            if left:
                time.sleep(0.02)

    def daemon_pid(self, name: str) -> int:
        """Return the pid of node ``name``'s sshd (our child)."""
        return self._daemons[name].proc.pid

    def close(self) -> None:
        """Stop every sshd."""
        for name in list(self._daemons):
            self.stop(name)


def sshd_config(spec: ServerSpec, port: int) -> str:
    """Return an sshd_config that serves one node on 127.0.0.1:``port``."""
    # SetEnv overrides the PATH that sshd gives every session (its own default, ~/.ssh/environment).
    env = [f'SetEnv "PATH={session_path(spec)}"'] if spec.path_dirs or spec.std_dirs else []
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
