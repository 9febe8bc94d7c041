"""A simulated GPU fleet: N nodes served over real SSH on 127.0.0.1, and a ready inventory.

::

    with SimFleet(Path("/tmp/f"), nodes=4, gpus=8) as fleet:
        w = fleet.node("node1").spawn(gpu=0, mib=4096, behaviour="stubborn")
        settings = gpubot.config.load(fleet.config_path)   # the rest of gpubot, unchanged

The process that starts a fleet becomes a child subreaper and runs the simulated driver (a
thread), so workloads whose parents die are reaped here and every death is timed. ``stop()``
kills, by pid and start time, exactly the processes the fleet started, and nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import asyncssh

from gpubot.core.protect import DEFAULT_DAEMON_PATHS
from gpubot.errors import SimError, UsageError
from gpubot.sim import cgroups, simstate
from gpubot.sim.cgroups import CgroupSet, Placement
from gpubot.sim.control import ControlServer, socket_path
from gpubot.sim.driver import Driver
from gpubot.sim.node import SimNode, Workload
from gpubot.sim.server import (
    AsyncsshPool,
    HungListener,
    ServerPool,
    ServerSpec,
    SshdPool,
    _signal_if,
    check_port_free,
)
from gpubot.sim.sudo import parse_sudoers

__all__ = ["SERVERS", "SimFleet", "SimNode", "Workload"]

SERVERS = ("asyncssh", "sshd")
STANDALONE = ("simstate.py", "nvidia_smi.py", "workload.py", "sudo.py", "runtimes.py")
RUNTIMES = ("docker", "podman", "slurm", "crictl")  # what the inventory lists (gpubot.config)
PR_SET_CHILD_SUBREAPER = 36


class SimFleet:
    """N simulated GPU nodes, each with its own SSH server on 127.0.0.1."""

    def __init__(
        self,
        directory: Path | str,
        nodes: int = 4,
        gpus: int = 8,
        server: str = "asyncssh",
        release_delay_s: float = 1.5,
        model: str = "NVIDIA H200",
        memory_mib: int = 143771,
        base_port: int | None = None,
        on_stop: Callable[[], None] | None = None,
        sudo_rule: str | None = None,
        minors: Sequence[int] | None = None,
        persistenced: bool = False,
        view_user: str | None = None,
        hidepid: bool = False,
        runtimes: bool = False,
    ) -> None:
        """``minors``: the device minor of each GPU index, e.g. ``[3, 2, 1, 0]`` (a permutation;
        default: minor == index). Real boxes number device files apart from GPU indices.

        ``persistenced``: every node runs a persistence daemon (root, from the node's
        ``sbin/nvidia-persistenced``) holding every GPU's device file, and the inventory lists
        that executable as protected, as an admin would.

        ``view_user``: SSH sessions log in and run as this Linux user (not root): fuser and
        /proc show what such an account sees. ``hidepid``: each session's /proc is mounted
        ``hidepid=2`` (needs ``view_user``). Both only with the asyncssh server.

        ``sudo_rule``: a sudoers block (the README's, ``gpubot.sim.sudo.readme_sudo_rule``);
        given, every node gets the sudo stand-in first on its session PATH, allowing only that
        rule's commands with ``sudo -n``, and ``sudo = true`` in the inventory.

        ``runtimes``: every node gets the stand-in ``docker``, ``podman``, ``crictl``,
        ``scontrol``, ``scancel`` and ``systemctl`` (``gpubot.sim.runtimes``) on its session PATH
        (after the sudo stand-in's directory, before the standard one), and the inventory lists
        ``runtimes = ["docker", "podman", "slurm", "crictl"]``. Without it a session finds this
        machine's own programs, if any (a sudo node never does: its rule points into the node).
        Workloads go into real cgroups (``SimNode.spawn(cgroup=...)``) either way.
        """
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 64:
            raise UsageError(f"nodes must be 1-64, not {nodes!r}")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
            raise UsageError(f"gpus must be 1-64, not {gpus!r}")
        if minors is not None and sorted(minors) != list(range(gpus)):
            raise UsageError(f"minors must be a permutation of 0-{gpus - 1}, not {minors!r}")
        self._minors = list(minors) if minors is not None else list(range(gpus))
        self._persistenced = persistenced
        if server not in SERVERS:
            raise UsageError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
        if isinstance(release_delay_s, bool) or not isinstance(release_delay_s, int | float):
            raise UsageError(f"release delay must be a number, not {release_delay_s!r}")
        if release_delay_s < 0:
            raise UsageError(f"release delay must be >= 0 s, not {release_delay_s}")
        if not model or "," in model or "\n" in model:
            raise UsageError(f"bad GPU model name {model!r}")
        if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib < 1:
            raise UsageError(f"memory must be a positive number of MiB, not {memory_mib!r}")
        if base_port is not None and not 1 <= base_port <= 65536 - nodes:
            raise UsageError(f"base port {base_port} leaves no room for {nodes} nodes")
        try:
            self._sudo_rule = None if sudo_rule is None else parse_sudoers(sudo_rule)
        except ValueError as exc:
            raise UsageError(f"sudo rule: {exc}") from None
        self.directory = Path(directory).absolute()
        self.size = nodes
        self.gpus = gpus
        self.server = server
        self.model = model
        self.memory_mib = memory_mib
        self.base_port = base_port
        self._release_delay_s = float(release_delay_s)
        self._on_stop = on_stop
        self.root = self.directory
        self.nodes: list[SimNode] = []
        if (view_user or hidepid) and server != "asyncssh":
            raise UsageError("view_user and hidepid need the asyncssh server")
        if hidepid and not view_user:
            raise UsageError("hidepid needs view_user: root sees every process anyway")
        if view_user is not None and os.geteuid() != 0:
            raise UsageError("view_user needs root (to start sessions as another user)")
        try:
            pw = pwd.getpwnam(view_user) if view_user else pwd.getpwuid(os.geteuid())
        except KeyError:
            raise UsageError(f"no such user {view_user!r}") from None
        self._run_as = (pw.pw_uid, pw.pw_gid) if view_user else None
        self.hidepid = hidepid  # every session sees /proc mounted hidepid=2
        self.runtimes = runtimes
        self.user = pw.pw_name
        self._home = pw.pw_dir if pw.pw_dir and os.path.isdir(pw.pw_dir) else "/"
        shell = pw.pw_shell
        ok = shell and os.access(shell, os.X_OK) and not shell.endswith(("nologin", "false"))
        self._shell = shell if ok else "/bin/sh"
        self.python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else ""
        self.python = self.python or sys.executable
        self.python_real = os.path.realpath(self.python)
        self._own_root = False
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()
        self._popens: dict[int, subprocess.Popen[bytes]] = {}
        self._supervisors: dict[int, str] = {}  # pid -> node, of respawn supervisors
        self._driver: Driver | None = None
        self._pool: ServerPool | None = None
        self._hung: dict[str, HungListener] = {}
        self._control: ControlServer | None = None
        self._cgroups: CgroupSet | None = None
        self._placements: dict[str, list[Placement]] = {}  # node -> the cgroups made for it

    # ---- paths ----------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        """The gpubot.toml inventory of this fleet."""
        return self.directory / "gpubot.toml"

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file that pins every node's host key."""
        return self.root / "known_hosts"

    @property
    def client_key(self) -> Path:
        """The private key gpubot logs in with (ed25519, OpenSSH format)."""
        return self.root / "client_key"

    @property
    def lib_dir(self) -> Path:
        """Where the standalone nvidia-smi and workload programs live."""
        return self.root / "lib"

    @property
    def control_path(self) -> Path:
        """The control socket of ``gpubot sim spawn|fault|state``."""
        return socket_path(self.directory)

    def node(self, name: str) -> SimNode:
        """Return the node called ``name``; raise ``UsageError`` for an unknown one."""
        for n in self.nodes:
            if n.name == name:
                return n
        names = ", ".join(n.name for n in self.nodes) or "none (the fleet is not started)"
        raise UsageError(f"unknown node {name!r} (nodes: {names})")

    # ---- life -----------------------------------------------------------------------------

    def __enter__(self) -> SimFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the nodes, start the driver and the SSH servers, write the inventory."""
        if self._started:
            return
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.base_port is not None:
            for i in range(self.size):
                check_port_free(self.base_port + i)
        _become_subreaper()
        self._check_python()
        self.root = self._choose_root()
        self._write_lib()
        self._write_keys()
        for i in range(self.size):
            node = SimNode(self, f"node{i + 1}", i, self.root, self.gpus, self.model,
                           self.memory_mib, self._release_delay_s, self._minors)  # fmt: skip
            node.create(self.lib_dir, self.python)
            if self._sudo_rule is not None:
                node.create_sudo(self.lib_dir, self.python, self._sudo_rule)
            if self.runtimes:
                node.create_runtimes(self.lib_dir, self.python)
            self.nodes.append(node)
        self._driver = Driver([str(n.state_dir) for n in self.nodes], self._reap)
        self._driver.start()
        self._pool = AsyncsshPool() if self.server == "asyncssh" else SshdPool(self._reap)
        for i, node in enumerate(self.nodes):
            port = self.base_port + i if self.base_port is not None else 0
            node.port = self._pool.start(self._spec(node), port)
            if isinstance(self._pool, SshdPool):
                self._watch_sshd(node)
        self._write_known_hosts()
        if self._persistenced:
            for node in self.nodes:
                node.spawn(None, behaviour="persistenced",
                           exe_path=node.daemon_exe("nvidia-persistenced"))  # fmt: skip
        self._write_config()
        self._control = ControlServer(self.control_path, self, self._on_stop)

    def stop(self) -> None:
        """Stop the servers and kill (by pid and start time) every process the fleet started."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        if self._control is not None:
            self._control.close()
        for h in self._hung.values():
            h.close()
        self._hung.clear()
        if self._pool is not None:
            self._pool.close()
        self._kill_all()
        self._release_cgroups()
        if self._driver is not None:
            self._driver.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.directory / "fleet").unlink()

    def _kill_all(self) -> None:
        with self._lock:
            popens = list(self._popens.values())
        # Supervisors first, so that nothing respawns; then every registered process.
        for p in popens:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        targets: list[tuple[int, int]] = []
        for _ in range(2):
            for node in self.nodes:
                for pid, ticks in node.live_pids():
                    if _signal_if(pid, ticks, signal.SIGKILL):
                        targets.append((pid, ticks))
                # Hung nvidia-smi calls: killed, but reaped by whoever started them.
                for pid, ticks in node.hung_smi():
                    _signal_if(pid, ticks, signal.SIGKILL)
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            busy = [p for p in popens if p.poll() is None]
            for pid, ticks in targets:
                if simstate.start_ticks(pid) == ticks:
                    self._reap(pid)
            left = [t for t in targets if simstate.is_alive(*t)]
            if not busy and not left:
                break
            time.sleep(0.02)

    # ---- helpers for SimNode --------------------------------------------------------------

    def _track(self, proc: subprocess.Popen[bytes], supervisor_of: str | None = None) -> None:
        with self._lock:
            self._popens[proc.pid] = proc
            if supervisor_of is not None:
                self._supervisors[proc.pid] = supervisor_of
        if self._driver is not None:
            self._driver.watch_child(proc.pid)

    def _kill_supervisors(self, node: str) -> int:
        """SIGKILL the live respawn supervisors of ``node`` (unreaped children: pid is safe)."""
        with self._lock:
            procs = [self._popens[p] for p, n in self._supervisors.items() if n == node]
        killed = 0
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                    killed += 1
        return killed

    def _place(self, node: str, kind: str, uid: int) -> Placement:
        """Make a fresh cgroup of ``kind`` for a workload of ``node``; remember it."""
        with self._lock:
            if self._cgroups is None:
                why = cgroups.unavailable()
                if why is not None:
                    raise SimError(f"cannot put workloads in cgroups here: {why}")
                with open("/proc/self/mountinfo", encoding="utf-8") as f:
                    mountinfo = f.read()
                with open("/proc/self/cgroup", encoding="utf-8") as f:
                    found = cgroups.find_hierarchies(mountinfo, f.read())
                if isinstance(found, str):
                    raise SimError(f"cannot put workloads in cgroups here: {found}")
                self._cgroups = CgroupSet(found)
            cgs = self._cgroups
        placement = cgs.create(kind, uid)
        with self._lock:
            self._placements.setdefault(node, []).append(placement)
        return placement

    def _move(self, placement: Placement, pid: int) -> None:
        assert self._cgroups is not None
        self._cgroups.move(placement, pid)

    def _unplace(self, node: str, placement: Placement) -> None:
        """Remove one workload's cgroup (its processes are killed first) and forget it."""
        with self._lock:
            mine = self._placements.get(node, [])
            if placement in mine:
                mine.remove(placement)
        if self._cgroups is not None:
            self._cgroups.release(placement)

    def _release_cgroups(self, node: str | None = None) -> list[str]:
        """Remove the cgroups made for ``node``'s workloads (every node's: None); return the
        directories that could not be removed."""
        with self._lock:
            names = [node] if node is not None else list(self._placements)
            todo = [p for n in names for p in self._placements.pop(n, [])]
        left: list[str] = []
        if self._cgroups is not None:
            for placement in reversed(todo):
                left += self._cgroups.release(placement)
        return left

    def _watch(self, state_dir: str, pid: int, ticks: int) -> None:
        if self._driver is not None:
            self._driver.watch(state_dir, pid, ticks)

    def _reap(self, pid: int) -> None:
        """Collect the exit status of ``pid`` if it is our child (spawned, or orphaned to us)."""
        with self._lock:
            proc = self._popens.get(pid)
        if proc is not None:
            if proc.poll() is not None:
                with self._lock:
                    self._popens.pop(pid, None)
                    self._supervisors.pop(pid, None)
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    def _spec(self, node: SimNode) -> ServerSpec:
        return ServerSpec(
            name=node.name,
            host_key=node.dir / "ssh_host_ed25519_key",
            authorized_keys=self.root / "authorized_keys",
            user=self.user,
            home=self._home,
            shell=self._shell,
            workdir=node.dir,
            path_dirs=tuple(
                str(d)
                for d, on in ((node.sudo_dir, node.sudo), (node.runtime_dir, node.runtimes))
                if on
            ),
            run_as=self._run_as,
            hidepid=self.hidepid,
        )

    def _servers_for(self, node: SimNode) -> ServerPool:
        if self._pool is None:
            raise UsageError("the fleet is not started")
        hung = self._hung.pop(node.name, None)
        if hung is not None:
            hung.close()
        return self._pool

    def _start_server(self, node: SimNode) -> None:
        pool = self._servers_for(node)
        pool.stop(node.name)
        node.port = pool.start(self._spec(node), node.port)
        if isinstance(pool, SshdPool):
            self._watch_sshd(node)

    def _hang_server(self, node: SimNode) -> None:
        self._servers_for(node).stop(node.name)
        self._hung[node.name] = HungListener(node.port)

    def _watch_sshd(self, node: SimNode) -> None:
        assert isinstance(self._pool, SshdPool)
        d = self._pool._daemons[node.name]
        if self._driver is not None:
            self._driver.watch_child(d.proc.pid)

    # ---- setup ----------------------------------------------------------------------------

    def _check_python(self) -> None:
        probe = subprocess.run(
            [self.python, "-S", "-c", "import sys; sys.exit(sys.version_info < (3, 10))"],
            capture_output=True,
        )
        if probe.returncode != 0:
            self.python = sys.executable
            self.python_real = os.path.realpath(self.python)

    def _choose_root(self) -> Path:
        """Return where the nodes live: the directory, or a fresh one that others can reach."""
        if os.geteuid() != 0 or _traversable(self.directory):
            return self.directory
        # Workloads of other users (and their Python) must reach the node files: the given
        # directory is private (like pytest's), so the nodes live in a world-traversable one.
        root = Path(tempfile.mkdtemp(prefix="gpusim-", dir="/tmp"))
        os.chmod(root, 0o755)
        self._own_root = True
        link = self.directory / "fleet"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(root)
        return root

    def _write_lib(self) -> None:
        pkg = self.lib_dir / "gpusim"
        pkg.mkdir(parents=True, exist_ok=True)
        here = Path(__file__).parent
        (pkg / "__init__.py").write_text('"""Standalone parts of gpubot.sim."""\n')
        for name in STANDALONE:
            shutil.copyfile(here / name, pkg / name)
        (self.lib_dir / "gpusim_workload.py").write_text(
            "import sys\n\nfrom gpusim.workload import main\n\nsys.exit(main())\n"
        )
        for p in [self.lib_dir, pkg, *self.lib_dir.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)

    def _write_keys(self) -> None:
        client = asyncssh.generate_private_key("ssh-ed25519", comment=f"gpusim@{self.root}")
        client.write_private_key(str(self.client_key))
        client.write_public_key(str(self.client_key) + ".pub")
        os.chmod(self.client_key, 0o600)
        (self.root / "authorized_keys").write_bytes(client.export_public_key())
        for i in range(self.size):
            d = self.root / f"node{i + 1}"
            d.mkdir(parents=True, exist_ok=True)
            host = asyncssh.generate_private_key("ssh-ed25519", comment=f"node{i + 1}")
            host.write_private_key(str(d / "ssh_host_ed25519_key"))
            host.write_public_key(str(d / "ssh_host_ed25519_key.pub"))
            os.chmod(d / "ssh_host_ed25519_key", 0o600)

    def _write_known_hosts(self) -> None:
        lines = []
        for n in self.nodes:
            pub = (n.dir / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"[127.0.0.1]:{n.port} {pub[0]} {pub[1]}\n")
        self.known_hosts.write_text("".join(lines))

    def _write_config(self) -> None:
        q = _toml_str
        out = [
            f"# A simulated GPU fleet: {self.size} nodes x {self.gpus} {self.model}, "
            f"{self.server} SSH servers on 127.0.0.1.",
            "# Written by gpubot.sim; load it with gpubot --config (or $GPUBOT_CONFIG).",
            "",
            "[database]",
            f"url = {q('sqlite:///' + str(self.root / 'gpubot.db'))}",
            "",
            "[ssh]",
            f"known_hosts = {q(str(self.known_hosts))}",
            "",
        ]
        if self._persistenced:  # the daemon's executable, where this fleet put it
            paths = [
                *DEFAULT_DAEMON_PATHS,
                *(n.daemon_exe("nvidia-persistenced") for n in self.nodes),
            ]
            out += ["[reset]", f"protected = [{', '.join(q(p) for p in paths)}]", ""]
        for n in self.nodes:
            parity = "odd" if (n.index + 1) % 2 else "even"
            out += [
                "[[nodes]]",
                f"name = {q(n.name)}",
                'host = "127.0.0.1"',
                f"port = {n.port}",
                f"user = {q(self.user)}",
                f"key = {q(str(self.client_key))}",
                f"dev_prefix = {q(n.dev_prefix)}",
                f"nvidia_smi = {q(n.nvidia_smi)}",
                f"driver_dir = {q(n.driver_dir)}",
                *(["sudo = true"] if n.sudo else []),
                *([f"runtimes = [{', '.join(q(r) for r in RUNTIMES)}]"] if n.runtimes else []),
                f'groups = ["sim", "{parity}"]',
                "",
            ]
        self.config_path.write_text("\n".join(out), encoding="utf-8")


def _toml_str(s: str) -> str:
    """Quote ``s`` as a TOML basic string."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _traversable(path: Path) -> bool:
    """Tell whether every user may traverse ``path`` and all its parents."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _become_subreaper() -> None:
    """Adopt orphaned descendants (a killed supervisor's child) so that we can reap them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    except (OSError, AttributeError) as exc:
        raise SimError(f"cannot become a child subreaper: {exc}") from None
