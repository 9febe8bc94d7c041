"""The stand-in ``docker``, ``podman``, ``crictl``, ``scontrol``, ``scancel`` and ``systemctl``.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and run by the
launchers in ``<node>/runtime-bin/`` (on the SSH sessions' PATH of a fleet started with
``runtimes=True``). They answer from the node's registry, ``<state>/runtimes.json``, read and
written under the node's state lock: one entry per workload spawned in a container, pod, Slurm
job, service or session cgroup::

    {"delay_s": 0.0, "entries": [{
        "kind": "docker",                   # docker podman kubernetes slurm service session
        "id": "<64 hex>",                   # container id; job id; unit name
        "name": "train-llama",              # container name; job name; unit
        "image": "pytorch/pytorch:2.3", "labels": {"k": "v"}, "restart": "always",
        "pod": {"namespace": "ml", "name": "trainer-0", "uid": "<uuid>"} | null,
        "job": {"id": "8812", "name": "sweep-lr", "user": "bob", "uid": 1001,
                "group": "bob", "gid": 1001, "home": "/home/bob"} | null,
        "user": "bob", "uid": 1001, "gid": 1001, "gpu": 0, "process": "python3",
        "cgroup": "/system.slice/docker-<id>.scope",   # as /proc/PID/cgroup shows it (v2)
        "top": "/sys/fs/cgroup/unified/system.slice/docker-<id>.scope",  # what a stop kills
        "pid": 4242, "start_ticks": 1234, "supervisor_pid": 4240 | null,
        "supervisor_start_ticks": 1230 | null, "sandbox_id": "<64 hex>" | null,
        "created": 1700000000.0, "state": "running" | "stopped" | "cancelled",
        "finished": null | 1700000100.0, "exit_code": null | 143}]}

What each answers, and where its format comes from:

- ``docker inspect ID|NAME...``: a JSON array (4-space indent, struct field order, ``<>&``
  escaped as Go's encoder does) of ``Id``, ``Created``, ``Path``, ``Args``, ``State`` (``Status``,
  ``Running``, ``Restarting``, ``Pid``, ``ExitCode``, ``StartedAt``, ``FinishedAt``...),
  ``Image``, ``Name`` (``/name``), ``RestartCount``, ``HostConfig.RestartPolicy`` (``Name``,
  ``MaximumRetryCount``) and ``Config`` (``Image``, ``Labels``...), as in Docker's reference for
  ``docker inspect`` (docs.docker.com/reference/cli/docker/inspect) and the Engine API's
  ``GET /containers/{id}/json``. An unknown one: what was found is printed (``[]`` if nothing),
  ``Error: No such object: ID`` on stderr, exit 1 (docker/cli ``inspect.go``, PR #1071). Ids
  may be given in full, by a unique prefix, or by name.
- ``docker stop [-t N] ID|NAME...``: stops each for good (the restart policy no longer applies):
  the supervisor that stands in for dockerd's restart manager is killed, every process of the
  container's cgroup gets SIGTERM, and SIGKILL after N s (default 10, as ``docker stop``);
  prints each argument as given. Unknown: ``Error response from daemon: No such container: X``.
- ``podman inspect`` / ``podman stop``: the same, with podman's fields (``Name`` without a slash,
  ``ImageName``, ``State.CgroupPath``), a 5-space indent and no HTML escaping (podman's
  ``cmd/podman/inspect/inspect.go``: ``printJSON``), and its errors: ``Error: inspecting
  object: no such object: "X"`` (others ``error inspecting object: ...`` before it), ``Error: no
  container with name or ID "X" found: no such container``; exit 125 (podman's error status).
  Run by a user other than root, podman sees only that user's (rootless) containers: none.
- ``crictl inspect ID...``: the container status of cri-tools (``cmd/crictl/util.go``,
  ``outputStatusData``): one object ``{"info": {...}, "status": {...}}`` for one id, an array for
  several, keys sorted, 2-space indent; ``status.labels`` holds ``io.kubernetes.pod.name``,
  ``.pod.namespace``, ``.pod.uid`` and ``io.kubernetes.container.name``. An unknown id prints
  nothing and ``FATA[0000] get container status: rpc error: code = NotFound desc = an error
  occurred when try to find container "X": not found``, exit 1.
- ``scontrol [-o] show job ID``: Slurm's multi-line record (``JobId=8812 JobName=sweep-lr`` /
  ``   UserId=bob(1001) GroupId=bob(1001) MCS_label=N/A`` / ``   JobState=RUNNING ...``), as
  printed by Slurm 23 (scontrol(1); sites' published examples), then a blank line; ``-o`` puts
  it on one line. Unknown: ``slurm_load_jobs error: Invalid job id specified``, exit 1.
- ``scancel ID...``: prints nothing; SIGTERM to every process of the job's cgroup, SIGKILL after
  ``KILL_WAIT_S`` (slurm.conf's KillWait, 30 s by default, is shorter here). Unknown:
  ``scancel: error: Kill job error on job id X: Invalid job id specified``, exit 1.
- ``systemctl stop UNIT...``: for the fleet's ``gpusim-N.service`` units only. Unknown:
  ``Failed to stop X: Unit X not loaded.``, exit 5.

Run as a user other than root: docker and crictl cannot reach their daemon's socket (their
messages), scancel of another user's job is ``Access/permission denied``, systemctl stop says
``Interactive authentication required.`` (no polkit agent in an SSH session); scontrol answers.

``delay_s`` (``SimNode.set_runtime_delay``): every stand-in sleeps that long before answering.

This module picks the stand-in; ``containers`` answers for docker, podman and crictl, ``jobs`` for
scontrol, scancel and systemctl, and ``runtime_registry`` keeps the registry and stops entries.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from . import containers, jobs, simstate
from .runtime_registry import Entry, err, load

PROGRAMS = ("docker", "podman", "crictl", "scontrol", "scancel", "systemctl")


def _snapshot(state_dir: str) -> tuple[list[Entry], list[dict[str, Any]], float, str]:
    with simstate.locked(state_dir):
        reg = load(state_dir)
        st = simstate.load(state_dir)
    return reg["entries"], st["allocs"], float(reg.get("delay_s", 0.0)), str(st["node"])


def main(prog: str, argv: list[str], state_dir: str) -> int:
    """Run stand-in ``prog`` with ``argv`` against the registry in ``state_dir``."""
    entries, allocs, delay, node = _snapshot(state_dir)
    if delay > 0:
        time.sleep(delay)
        entries, allocs, _, _ = _snapshot(state_dir)
    root = os.geteuid() == 0
    try:
        if prog in ("docker", "podman"):
            return containers.container_cli(prog, argv, state_dir, entries, allocs, root)
        if prog == "crictl":
            return containers.crictl(argv, entries, allocs, root)
        if prog in ("scontrol", "scancel"):
            return jobs.slurm(prog, argv, state_dir, entries, allocs, node, root)
        if prog == "systemctl":
            return jobs.systemctl(argv, state_dir, entries, root)
    except BrokenPipeError:
        return 141
    err(f"gpusim: no stand-in called {prog!r}")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[3:], sys.argv[2]))
