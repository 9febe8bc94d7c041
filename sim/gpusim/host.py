"""What a simulated node needs from the fleet that runs it: ``NodeHost``, which ``SimFleet`` is.

``SimNode`` speaks to its fleet only through this interface, so that ``node.py`` never imports
``fleet.py``: the fleet builds nodes, a node never builds or inspects its fleet.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol

from gpusim.people import Accounts
from gpusim.placements import Placements


class NodeHost(Protocol):
    """The fleet as one of its nodes sees it."""

    @property
    def lib_dir(self) -> Path:
        """Where the standalone programs (``gpusim``) live."""
        ...

    @property
    def python_real(self) -> str:
        """The interpreter (resolved) that workloads run with: copied or linked per node."""
        ...

    @property
    def user(self) -> str:
        """The Linux user that SSH sessions log in as."""
        ...

    @property
    def client_key(self) -> Path:
        """The private key that logs in to every node."""
        ...

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file that pins every node's host key."""
        ...

    @property
    def people(self) -> Accounts:
        """The fleet's own people (``gpusim.people``): name -> account."""
        ...

    @property
    def placements(self) -> Placements:
        """The workload cgroups of every node."""
        ...

    def track(self, proc: subprocess.Popen[bytes], supervisor_of: str | None = None) -> None:
        """Keep our child ``proc`` (a respawn supervisor of node ``supervisor_of``) to reap."""
        ...

    def watch(self, state_dir: str, pid: int, ticks: int) -> None:
        """Have the driver record the death of ``(pid, ticks)`` the moment it happens."""
        ...

    def kill_supervisors(self, node: str) -> int:
        """SIGKILL the live respawn supervisors of ``node``; return how many."""
        ...

    def stop_server(self, node: str) -> None:
        """Stop ``node``'s SSH server and drop its connections."""
        ...

    def start_server(self, node: str) -> None:
        """Start ``node``'s SSH server again on the same port."""
        ...

    def hang_server(self, node: str) -> None:
        """Replace ``node``'s SSH server by a listener that never speaks SSH."""
        ...
