"""Processes the fleet did not start that hold a simulated GPU: a real container's, a Slurm job's.

A real runtime's process holds a GPU of the simulated fleet by opening that GPU's device file of
the node (bind-mounted into a container, or opened by a job's script). ``SimNode.adopt`` then
records it as the driver records a CUDA context: an allocation of ``mib`` on that GPU, keyed by
pid and start time, that ``nvidia-smi --query-compute-apps`` lists while the process lives and
whose memory the driver frees ``release_delay_s`` after it dies.

The process stays its starter's: the fleet never signals an adopted process (``live_pids``
leaves it out); its runtime stops it.
"""

from __future__ import annotations

import os
import pwd
import time
from typing import Any

from gpusim import simstate
from gpusim.errors import SimUsageError

BEHAVIOUR = "adopted"  # the allocation's behaviour: nobody in the fleet drives this process


def holds(pid: int, path: str) -> bool:
    """Tell whether process ``pid`` has the file ``path`` open (same device and inode)."""
    try:
        want = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False


def record(node: str, pid: int, gpu: int, mib: int, util_pct: int, device: str) -> dict[str, Any]:
    """Return the allocation of an adopted process, checked; ``SimUsageError`` if it cannot be.

    The process must be alive and hold ``device`` (its GPU's device file) open: the simulator
    lists only what a real driver would, a process with a context on that GPU.
    """
    for what, v, top in (("pid", pid, None), ("MiB", mib, None), ("util_pct", util_pct, 100)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if what == "pid" else 0):
            raise SimUsageError(f"{node}: adopt: bad {what} {v!r}")
        if top is not None and v > top:
            raise SimUsageError(f"{node}: adopt: {what} must be at most {top}, not {v}")
    st = simstate.proc_stat(pid)
    if st is None or st[0] in ("Z", "X", "x"):
        raise SimUsageError(f"{node}: adopt: no live process {pid}")
    if not holds(pid, device):
        raise SimUsageError(f"{node}: adopt: pid {pid} does not hold {device} open")
    uid = os.stat(f"/proc/{pid}").st_uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return {
        "pid": pid,
        "start_ticks": st[2],
        "gpu": gpu,
        "mib": mib,
        "util": util_pct,
        "behaviour": BEHAVIOUR,
        "name": simstate.cmdline_name(pid) or "?",
        "user": user,
        "supervisor": None,
        "hidden": False,
        "orphan": False,
        "adopted": True,
        "registered_at": time.time(),
        "died_at": None,
    }
