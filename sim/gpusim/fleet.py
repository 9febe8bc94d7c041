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
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from gpusim import fleet_setup, inventory, simstate
from gpusim import people as people_
from gpusim.control import ControlServer, socket_path
from gpusim.driver import Driver
from gpusim.errors import SimUsageError
from gpusim.node import SimNode, Workload
from gpusim.placements import Placements
from gpusim.server import HungListener, ServerPool, ServerSpec, check_port_free
from gpusim.server_asyncssh import AsyncsshPool
from gpusim.server_sshd import SshdPool

__all__ = ["SERVERS", "SimFleet", "SimNode", "Workload"]

SERVERS = fleet_setup.SERVERS
RUNTIMES = inventory.RUNTIMES


class SimFleet:
    """N simulated GPU nodes, each with its own SSH server on 127.0.0.1; a ``NodeHost``.

    ``minors``: the device minor of each GPU index, e.g. ``[3, 2, 1, 0]`` (a permutation;
    default: minor == index). Real boxes number device files apart from GPU indices.

    ``persistenced``: every node runs a persistence daemon (root, from the node's
    ``sbin/nvidia-persistenced``) holding every GPU's device file, and the inventory lists
    that executable as protected, as an admin would, after ``protected`` (a listed ``[reset]
    protected`` replaces gpubot's defaults: pass those to keep them).

    ``view_user``: SSH sessions log in and run as this Linux user (not root): fuser and
    /proc show what such an account sees. ``hidepid``: each session's /proc is mounted
    ``hidepid=2`` (needs ``view_user``). Both only with the asyncssh server.

    ``sudo_rule``: a sudoers block (the README's, ``gpusim.sudoers.readme_sudo_rule``);
    given, every node gets the sudo stand-in first on its session PATH, allowing only that
    rule's commands with ``sudo -n``, and ``sudo = true`` in the inventory.

    ``runtimes``: every node gets the stand-in ``docker``, ``podman``, ``crictl``,
    ``scontrol``, ``scancel`` and ``systemctl`` (``gpusim.runtimes``) on its session PATH
    (after the sudo stand-in's directory, before the standard one), and the inventory lists
    ``runtimes = ["docker", "podman", "slurm", "crictl"]``. Without it a session finds this
    machine's own programs, if any (a sudo node never does: its rule points into the node).
    Workloads go into real cgroups (``SimNode.spawn(cgroup=...)``) either way. A list of
    runtime names instead (e.g. ``["docker"]``) installs no stand-in: the inventory lists those
    runtimes, and sessions run this machine's real programs (``SimNode.adopt`` makes their
    containers' and jobs' processes compute apps).

    ``session_path``: directories put first on every session's PATH (wrappers that point this
    machine's ``docker`` or ``scontrol`` at a test's own daemon, for example).

    ``without``: program names the nodes lack (e.g. ``["fuser"]``): sessions get a standard
    PATH of links to this machine's programs but those.
    """

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
        runtimes: bool | Sequence[str] = False,
        session_path: Sequence[str] = (),
        protected: Sequence[str] = (),
        without: Sequence[str] = (),
        people: Sequence[str] = (),
    ) -> None:
        """Check the options (``SimUsageError``) and start nothing: ``start`` (or ``with``) does."""
        fleet_setup.check_options(
            nodes=nodes,
            gpus=gpus,
            server=server,
            release_delay_s=release_delay_s,
            model=model,
            memory_mib=memory_mib,
            base_port=base_port,
            minors=minors,
            view_user=view_user,
            hidepid=hidepid,
        )
        self._listed, self._path_dirs = fleet_setup.runtime_options(runtimes, session_path)
        self._minors = list(minors) if minors is not None else list(range(gpus))
        self._persistenced = persistenced
        self._protected = fleet_setup.paths("protected", protected)
        self._without = fleet_setup.program_names(without)
        self.people = people_.accounts(people)  # name -> account of the fleet alone (root)
        self._sudo_rule = fleet_setup.sudo_rule(sudo_rule)
        self.directory = Path(directory).absolute()
        self.size, self.gpus, self.server, self.model = nodes, gpus, server, model
        self.memory_mib, self.base_port = memory_mib, base_port
        self._release_delay_s = float(release_delay_s)
        self._on_stop = on_stop
        self.root = self.directory
        self.nodes: list[SimNode] = []
        pw = fleet_setup.account(view_user)
        self._run_as = (pw.pw_uid, pw.pw_gid) if view_user else None
        self.hidepid = hidepid  # every session sees /proc mounted hidepid=2
        self.runtimes = runtimes is True  # the stand-ins
        self.user = pw.pw_name
        self._home, self._shell = fleet_setup.home_and_shell(pw)
        self.python = fleet_setup.node_python()
        self.python_real = os.path.realpath(self.python)
        self._init_running()

    def _init_running(self) -> None:
        """Set up what a running fleet holds: nothing yet, until ``start``."""
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
        self.placements = Placements()  # the workloads' cgroups, node by node

    def login_as(self, user: str) -> None:
        """Make a fleet not started yet log in as ``user`` (home ``/``, that user's shell)."""
        if self._started:
            raise SimUsageError("login_as: the fleet is started already")
        pw = pwd.getpwnam(user)
        self.user = pw.pw_name
        self._home = "/"
        self._shell = pw.pw_shell

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
        """Return the node called ``name``; raise ``SimUsageError`` for an unknown one."""
        for n in self.nodes:
            if n.name == name:
                return n
        names = ", ".join(n.name for n in self.nodes) or "none (the fleet is not started)"
        raise SimUsageError(f"unknown node {name!r} (nodes: {names})")

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
        fleet_setup.become_subreaper()
        self.python = fleet_setup.usable_python(self.python)
        self.python_real = os.path.realpath(self.python)
        fresh = fleet_setup.choose_root(self.directory)
        self._own_root = fresh is not None
        self.root = fresh or self.directory
        fleet_setup.write_lib(self.lib_dir)
        if self._without:
            fleet_setup.write_std_bin(self.root / "std-bin", self._without)
        if self.people:
            people_.write_standins(self.root / "people-bin", self.people)
            self._path_dirs = (str(self.root / "people-bin"), *self._path_dirs)
        inventory.write_keys(self.root, self.client_key, self.size)
        for i in range(self.size):
            node = SimNode(
                self,
                f"node{i + 1}",
                i,
                self.root,
                self.gpus,
                self.model,
                self.memory_mib,
                self._release_delay_s,
                self._minors,
            )
            node.create(self.lib_dir, self.python)
            if self._sudo_rule is not None:
                node.create_sudo(self.lib_dir, self.python, self._sudo_rule)
            if self.runtimes:
                node.create_runtimes(self.lib_dir, self.python)
            node.runtime_names = self._listed
            self.nodes.append(node)
        self._driver = Driver([str(n.state_dir) for n in self.nodes], self._reap)
        self._driver.start()
        self._pool = AsyncsshPool() if self.server == "asyncssh" else SshdPool(self._reap)
        for i, node in enumerate(self.nodes):
            port = self.base_port + i if self.base_port is not None else 0
            node.port = self._pool.start(self._spec(node), port)
            if isinstance(self._pool, SshdPool):
                self._watch_sshd(node)
        inventory.write_known_hosts(self.known_hosts, self.nodes)
        if self._persistenced:
            for node in self.nodes:
                node.spawn(
                    None, behaviour="persistenced", exe_path=node.daemon_exe("nvidia-persistenced")
                )
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
        self.placements.release()
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
                    if simstate.signal_if(pid, ticks, signal.SIGKILL):
                        targets.append((pid, ticks))
                # Hung nvidia-smi calls: killed, but reaped by whoever started them.
                for pid, ticks in node.hung_smi():
                    simstate.signal_if(pid, ticks, signal.SIGKILL)
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

    # ---- NodeHost: what the nodes ask of their fleet ----------------------------------------

    def track(self, proc: subprocess.Popen[bytes], supervisor_of: str | None = None) -> None:
        """Keep our child ``proc`` (a respawn supervisor of node ``supervisor_of``) to reap."""
        with self._lock:
            self._popens[proc.pid] = proc
            if supervisor_of is not None:
                self._supervisors[proc.pid] = supervisor_of
        if self._driver is not None:
            self._driver.watch_child(proc.pid)

    def kill_supervisors(self, node: str) -> int:
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

    def watch(self, state_dir: str, pid: int, ticks: int) -> None:
        """Have the driver record the death of ``(pid, ticks)`` the moment it happens."""
        if self._driver is not None:
            self._driver.watch(state_dir, pid, ticks)

    def stop_server(self, node: str) -> None:
        """Stop ``node``'s SSH server and drop its connections."""
        self._servers_for(node).stop(node)

    def start_server(self, node: str) -> None:
        """Start ``node``'s SSH server again on the same port."""
        pool = self._servers_for(node)
        pool.stop(node)
        n = self.node(node)
        n.port = pool.start(self._spec(n), n.port)
        if isinstance(pool, SshdPool):
            self._watch_sshd(n)

    def hang_server(self, node: str) -> None:
        """Replace ``node``'s SSH server by a listener that never speaks SSH."""
        self._servers_for(node).stop(node)
        self._hung[node] = HungListener(self.node(node).port)

    # ---- helpers ---------------------------------------------------------------------------

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
            path_dirs=(
                *self._path_dirs,
                *(
                    str(d)
                    for d, on in ((node.sudo_dir, node.sudo), (node.runtime_dir, node.runtimes))
                    if on
                ),
                str(node.kernlog_dir),  # the kernel log's stand-ins: never this machine's log
            ),
            run_as=self._run_as,
            hidepid=self.hidepid,
            std_dirs=(str(self.root / "std-bin"),) if self._without else None,
        )

    def execs(self) -> dict[str, int]:
        """Return how many commands each node's SSH server has run (asyncssh servers only)."""
        return dict(getattr(self._pool, "execs", {}))

    def _servers_for(self, node: str) -> ServerPool:
        if self._pool is None:
            raise SimUsageError("the fleet is not started")
        hung = self._hung.pop(node, None)
        if hung is not None:
            hung.close()
        return self._pool

    def _watch_sshd(self, node: SimNode) -> None:
        assert isinstance(self._pool, SshdPool)
        if self._driver is not None:
            self._driver.watch_child(self._pool.daemon_pid(node.name))

    # ---- setup ----------------------------------------------------------------------------

    def _write_config(self) -> None:
        protected = None
        if self._persistenced:  # the daemon's executable, where this fleet put it
            protected = [
                *self._protected,
                *(n.daemon_exe("nvidia-persistenced") for n in self.nodes),
            ]
        text = inventory.config_text(
            self.nodes,
            title=f"A simulated GPU fleet: {self.size} nodes x {self.gpus} {self.model}, "
            f"{self.server} SSH servers on 127.0.0.1.",
            database_url="sqlite:///" + str(self.root / "gpubot.db"),
            known_hosts=self.known_hosts,
            user=self.user,
            client_key=self.client_key,
            protected=protected,
        )
        self.config_path.write_text(text, encoding="utf-8")
