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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

from . import simstate

PROGRAMS = ("docker", "podman", "crictl", "scontrol", "scancel", "systemctl")
REGISTRY_FILE = "runtimes.json"
RESTARTS = ("no", "always", "on-failure", "unless-stopped")
KILL_WAIT_S = 5.0
DOCKER_STOP_S = 10.0
ZERO_TIME = "0001-01-01T00:00:00Z"
Entry = dict[str, Any]


# ---- the registry ------------------------------------------------------------------------------


def load(state_dir: str) -> dict[str, Any]:
    """Read the node's registry (call with the state lock held)."""
    try:
        with open(os.path.join(state_dir, REGISTRY_FILE), encoding="utf-8") as f:
            reg: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        reg = {"delay_s": 0.0, "entries": []}
    return reg


def save(state_dir: str, reg: dict[str, Any]) -> None:
    """Replace the node's registry atomically (call with the state lock held)."""
    tmp = os.path.join(state_dir, f".{REGISTRY_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(reg, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(state_dir, REGISTRY_FILE))


def register(state_dir: str, entry: Entry) -> None:
    """Add one entry to the node's registry."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        reg["entries"].append(entry)
        save(state_dir, reg)


def set_delay(state_dir: str, seconds: float) -> None:
    """Make every stand-in of the node sleep ``seconds`` before answering."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        reg["delay_s"] = float(seconds)
        save(state_dir, reg)


def clear(state_dir: str) -> None:
    """Forget every entry and the delay."""
    with simstate.locked(state_dir):
        save(state_dir, {"delay_s": 0.0, "entries": []})


# ---- processes -----------------------------------------------------------------------------------


def members(directory: str) -> list[int]:
    """Return the pids in the cgroup ``directory`` and every cgroup below it."""
    out: list[int] = []
    for here, _dirs, files in os.walk(directory):
        if "cgroup.procs" in files:
            with (
                contextlib.suppress(OSError, ValueError),
                open(os.path.join(here, "cgroup.procs"), encoding="ascii") as f,
            ):
                out += [int(x) for x in f.read().split()]
    return out


def kill_members(directory: str, v2_path: str, sig: int) -> int:
    """Signal every process of the cgroup ``directory`` still in ``v2_path``; return how many.

    Each is pinned with a pidfd, then its own /proc/PID/cgroup is checked: a reused pid that
    now belongs elsewhere is never signalled.
    """
    sent = 0
    for pid in members(directory):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                lines = f.read().splitlines()
            if any(ln == f"0::{v2_path}" or ln.startswith(f"0::{v2_path}/") for ln in lines):
                signal.pidfd_send_signal(fd, sig)
                sent += 1
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.ENOENT):
                raise
        finally:
            os.close(fd)
    return sent


def _signal_if(pid: int | None, ticks: int | None, sig: int) -> bool:
    if pid is None or ticks is None:
        return False
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


def _wait(cond: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop(state_dir: str, entry: Entry, state: str, grace_s: float) -> int:
    """End an entry for good: mark it, kill its supervisor, TERM, then KILL; return the code."""
    with simstate.locked(state_dir):
        reg = load(state_dir)
        for e in reg["entries"]:
            if e["kind"] == entry["kind"] and e["id"] == entry["id"] and e["state"] == "running":
                e["state"] = state
        save(state_dir, reg)
    sup, sup_ticks = entry.get("supervisor_pid"), entry.get("supervisor_start_ticks")
    if sup is not None and _signal_if(sup, sup_ticks, signal.SIGKILL):  # nothing restarts now
        _wait(lambda: not simstate.is_alive(int(sup), int(sup_ticks or 0)), 5.0)
    top, path = entry["top"], entry["cgroup"]
    code = 143
    if kill_members(top, path, signal.SIGTERM) and not _wait(lambda: not members(top), grace_s):
        kill_members(top, path, signal.SIGKILL)
        _wait(lambda: not members(top), 5.0)
        code = 137
    with simstate.locked(state_dir):
        reg = load(state_dir)
        for e in reg["entries"]:
            if e["kind"] == entry["kind"] and e["id"] == entry["id"] and e["exit_code"] is None:
                e.update(finished=time.time(), exit_code=code)
        save(state_dir, reg)
    return code


def live(entry: Entry, allocs: list[dict[str, Any]]) -> tuple[bool, int, int, float | None]:
    """Return ``(running, pid or 0, restart count, died at)`` of an entry now."""
    sup = entry.get("supervisor_pid")
    if sup is not None:
        mine = [a for a in allocs if a.get("supervisor") == sup
                and a.get("registered_at", 0) >= entry["created"] - 1]  # fmt: skip
        up = [a for a in mine if simstate.is_alive(a["pid"], a["start_ticks"])]
        running = simstate.is_alive(sup, entry["supervisor_start_ticks"])
        died = max((a.get("died_at") or 0 for a in mine), default=0) or None
        return running, up[-1]["pid"] if up and running else 0, max(0, len(mine) - 1), died
    running = simstate.is_alive(entry["pid"], entry["start_ticks"])
    me = (entry["pid"], entry["start_ticks"])
    died = next((a.get("died_at") for a in allocs if (a["pid"], a["start_ticks"]) == me), None)
    return running, entry["pid"] if running else 0, 0, died


# ---- formats -------------------------------------------------------------------------------------


def go_json(obj: Any, indent: int, sort_keys: bool = False, escape_html: bool = True) -> str:
    """Encode as Go's encoding/json does: UTF-8 as is, ``<>&`` escaped unless told otherwise."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    if escape_html:
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text


def rfc3339(t: float | None, zero: str = ZERO_TIME) -> str:
    """Format ``t`` as Go's RFC3339Nano in UTC (``zero`` for None)."""
    if not t:
        return zero
    utc = dt.timezone.utc  # noqa: UP017 (dt.UTC is 3.11; the fleet may run this with 3.10)
    s = dt.datetime.fromtimestamp(t, tz=utc).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"{s}000Z"


def _local(t: float | None) -> str:
    if not t:
        return ZERO_TIME
    return dt.datetime.fromtimestamp(t).astimezone().isoformat()


def _digest(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def docker_doc(e: Entry, allocs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return ``docker inspect``'s object for one container."""
    running, pid, restarts, died = live(e, allocs)
    stopped = e["state"] != "running"
    status = "running" if running and not stopped else "exited"
    restarting = running and not pid and not stopped
    finished = e.get("finished") or (died if not running else None)
    code = e["exit_code"] if e["exit_code"] is not None else (0 if running else 137)
    return {
        "Id": e["id"],
        "Created": rfc3339(e["created"]),
        "Path": e["process"],
        "Args": [],
        "State": {
            "Status": "restarting" if restarting else status,
            "Running": running and not stopped,
            "Paused": False,
            "Restarting": restarting,
            "OOMKilled": False,
            "Dead": False,
            "Pid": pid,
            "ExitCode": code,
            "Error": "",
            "StartedAt": rfc3339(e["created"]),
            "FinishedAt": rfc3339(finished),
        },
        "Image": _digest(e["image"]),
        "Name": "/" + e["name"],
        "RestartCount": restarts,
        "Driver": "overlay2",
        "Platform": "linux",
        "HostConfig": {
            "RestartPolicy": {"Name": e["restart"], "MaximumRetryCount": 0},
            "CgroupParent": "",
            "Runtime": "runc",
        },
        "Config": {
            "Hostname": e["id"][:12],
            "User": "" if e["uid"] == 0 else f"{e['uid']}:{e['gid']}",
            "Cmd": [e["process"]],
            "Image": e["image"],
            "Labels": dict(e["labels"]),
        },
    }


def podman_doc(e: Entry, allocs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return ``podman inspect``'s object for one container."""
    running, pid, restarts, died = live(e, allocs)
    up = running and e["state"] == "running"
    finished = e.get("finished") or (died if not running else None)
    code = e["exit_code"] if e["exit_code"] is not None else (0 if running else 137)
    return {
        "Id": e["id"],
        "Created": _local(e["created"]),
        "Path": e["process"],
        "Args": [],
        "State": {
            "OciVersion": "1.1.0",
            "Status": "running" if up else "exited",
            "Running": up,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": pid if up else 0,
            "ExitCode": code,
            "Error": "",
            "StartedAt": _local(e["created"]),
            "FinishedAt": _local(finished),
            "CgroupPath": e["cgroup"],
        },
        "Image": _digest(e["image"])[7:],
        "ImageDigest": _digest(e["image"]),
        "ImageName": e["image"],
        "Name": e["name"],
        "RestartCount": restarts,
        "Driver": "overlay",
        "Config": {
            "Hostname": e["id"][:12],
            "User": "" if e["uid"] == 0 else f"{e['uid']}:{e['gid']}",
            "Cmd": [e["process"]],
            "Image": e["image"],
            "Labels": dict(e["labels"]),
        },
        "HostConfig": {
            "RestartPolicy": {"Name": e["restart"], "MaximumRetryCount": 0},
            "CgroupManager": "systemd",
            "CgroupParent": "machine.slice",
        },
    }


def crictl_doc(e: Entry, allocs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return ``crictl inspect``'s object for one container."""
    running, pid, restarts, died = live(e, allocs)
    pod = e["pod"]
    labels = {
        **e["labels"],
        "io.kubernetes.container.name": e["name"],
        "io.kubernetes.pod.name": pod["name"],
        "io.kubernetes.pod.namespace": pod["namespace"],
        "io.kubernetes.pod.uid": pod["uid"],
    }
    zero = "1970-01-01T00:00:00Z"
    return {
        "info": {
            "pid": pid,
            "removing": False,
            "runtimeType": "io.containerd.runc.v2",
            "sandboxID": e["sandbox_id"],
            "snapshotKey": e["id"],
            "snapshotter": "overlayfs",
        },
        "status": {
            "annotations": {
                "io.kubernetes.container.restartCount": str(restarts),
                "io.kubernetes.pod.terminationGracePeriod": "30",
            },
            "createdAt": rfc3339(e["created"]),
            "exitCode": 0 if running else 137,
            "finishedAt": rfc3339(None if running else died, zero),
            "id": e["id"],
            "image": {
                "annotations": {},
                "image": e["image"],
                "runtimeHandler": "",
                "userSpecifiedImage": e["image"],
            },
            "imageRef": _digest(e["image"]),
            "labels": labels,
            "logPath": f"/var/log/pods/{pod['namespace']}_{pod['name']}_{pod['uid']}/"
            f"{e['name']}/{restarts}.log",
            "message": "",
            "metadata": {"attempt": restarts, "name": e["name"]},
            "mounts": [],
            "reason": "" if running else "Error",
            "startedAt": rfc3339(e["created"]),
            "state": "CONTAINER_RUNNING" if running else "CONTAINER_EXITED",
        },
    }


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def scontrol_lines(e: Entry, allocs: list[dict[str, Any]], node: str) -> list[str]:
    """Return ``scontrol show job``'s record of one job, line by line."""
    running, _pid, _restarts, died = live(e, allocs)
    j = e["job"]
    start = e["created"]
    end = None if running else (e.get("finished") or died or time.time())
    if running:
        state, reason, code = "RUNNING", "None", "0:0"
    elif e["state"] == "cancelled":
        state, reason, code = "CANCELLED", "None", "0:15"
    else:
        state, reason, code = "FAILED", "NonZeroExitCode", "0:9"

    def local(t: float | None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"

    home = j.get("home") or f"/home/{j['user']}"
    return [
        f"JobId={j['id']} JobName={j['name']}",
        f"   UserId={j['user']}({j['uid']}) GroupId={j['group']}({j['gid']}) MCS_label=N/A",
        f"   Priority=4294901759 Nice=0 Account={j['user']} QOS=normal",
        f"   JobState={state} Reason={reason} Dependency=(null)",
        f"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={code}",
        f"   RunTime={_duration((end or time.time()) - start)} TimeLimit=UNLIMITED TimeMin=N/A",
        f"   SubmitTime={local(start)} EligibleTime={local(start)}",
        f"   AccrueTime={local(start)}",
        f"   StartTime={local(start)} EndTime={local(end)} Deadline=N/A",
        f"   SuspendTime=None SecsPreSuspend=0 LastSchedEval={local(start)} Scheduler=Main",
        f"   Partition=gpu AllocNode:Sid={node}:{e['pid']}",
        "   ReqNodeList=(null) ExcNodeList=(null)",
        f"   NodeList={node}",
        f"   BatchHost={node}",
        "   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
        "   TRES=cpu=1,node=1,billing=1,gres/gpu=1",
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
        "   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0",
        "   Features=(null) DelayBoot=00:00:00",
        "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
        f"   Command={home}/{j['name']}.sh",
        f"   WorkDir={home}",
        f"   StdErr={home}/slurm-{j['id']}.out",
        "   StdIn=/dev/null",
        f"   StdOut={home}/slurm-{j['id']}.out",
        "   TresPerNode=gres/gpu:1",
    ]


# ---- the programs --------------------------------------------------------------------------------


def _find(entries: list[Entry], kinds: tuple[str, ...], ref: str, names: bool) -> Entry | None:
    """Find by full id, by name (docker/podman), then by a unique id prefix."""
    mine = [e for e in entries if e["kind"] in kinds]
    for e in mine:
        if e["id"] == ref:
            return e
    if names:
        for e in mine:
            if e["name"] == ref.removeprefix("/"):
                return e
    if ref and all(c in "0123456789abcdef" for c in ref):
        hits = [e for e in mine if e["id"].startswith(ref)]
        if len(hits) == 1:
            return hits[0]
    return None


def _snapshot(state_dir: str) -> tuple[list[Entry], list[dict[str, Any]], float, str]:
    with simstate.locked(state_dir):
        reg = load(state_dir)
        st = simstate.load(state_dir)
    return reg["entries"], st["allocs"], float(reg.get("delay_s", 0.0)), str(st["node"])


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def main(prog: str, argv: list[str], state_dir: str) -> int:
    """Run stand-in ``prog`` with ``argv`` against the registry in ``state_dir``."""
    entries, allocs, delay, node = _snapshot(state_dir)
    if delay > 0:
        time.sleep(delay)
        entries, allocs, _, _ = _snapshot(state_dir)
    root = os.geteuid() == 0
    try:
        if prog in ("docker", "podman"):
            return _container_cli(prog, argv, state_dir, entries, allocs, root)
        if prog == "crictl":
            return _crictl(argv, entries, allocs, root)
        if prog in ("scontrol", "scancel"):
            return _slurm(prog, argv, state_dir, entries, allocs, node, root)
        if prog == "systemctl":
            return _systemctl(argv, state_dir, entries, root)
    except BrokenPipeError:
        return 141
    _err(f"gpusim: no stand-in called {prog!r}")
    return 127


def _container_cli(
    prog: str, argv: list[str], state_dir: str, entries: list[Entry],
    allocs: list[dict[str, Any]], root: bool,
) -> int:  # fmt: skip
    args = argv[1:] if argv[:1] == ["container"] else argv
    if not args or args[0] not in ("inspect", "stop"):
        _err(f"gpusim: {prog}: only 'inspect' and 'stop' are simulated")
        return 1 if prog == "docker" else 125
    verb, rest = args[0], args[1:]
    bad = 125 if prog == "podman" else 1
    grace = DOCKER_STOP_S
    refs: list[str] = []
    while rest:
        a, rest = rest[0], rest[1:]
        if verb == "stop" and a in ("-t", "--time") and rest:
            try:
                grace = float(rest[0])
            except ValueError:
                _err(f'invalid argument "{rest[0]}" for "-t, --time" flag')
                return bad
            rest = rest[1:]
        elif verb == "inspect" and a == "--type" and rest[:1] == ["container"]:
            rest = rest[1:]
        elif verb == "inspect" and a == "--type=container":
            pass
        elif a.startswith("-"):
            _err(f"gpusim: {prog} {verb}: option {a} is not simulated")
            return bad
        else:
            refs.append(a)
    if not refs:
        _err(f'"{prog} {verb}" requires at least 1 argument.')
        return bad
    if prog == "docker" and not root:
        _err(
            "permission denied while trying to connect to the Docker daemon socket at "
            'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.45/'
            f'containers/{refs[0]}/json": dial unix /var/run/docker.sock: connect: '
            "permission denied"
        )
        return 1
    visible = entries if root else []  # rootless podman sees only its own: none are
    found = [(r, _find(visible, (prog,), r, names=True)) for r in refs]
    if verb == "inspect":
        docs = [(docker_doc if prog == "docker" else podman_doc)(e, allocs)
                for _, e in found if e is not None]  # fmt: skip
        if prog == "docker":
            print(go_json(docs, 4))
            for r, e in found:
                if e is None:
                    _err(f"Error: No such object: {r}")
            return 1 if any(e is None for _, e in found) else 0
        print(go_json(docs, 5, escape_html=False))
        missing = [r for r, e in found if e is None]
        for r in missing[1:]:
            _err(f'error inspecting object: no such object: "{r}"')
        if missing:
            _err(f'Error: inspecting object: no such object: "{missing[0]}"')
            return 125
        return 0
    rc = 0
    for r, e in found:
        if e is None:
            if prog == "docker":
                _err(f"Error response from daemon: No such container: {r}")
                rc = 1
            else:
                _err(f'Error: no container with name or ID "{r}" found: no such container')
                rc = 125
            continue
        stop(state_dir, e, "stopped", grace)
        print(r, flush=True)
    return rc


def _crictl(argv: list[str], entries: list[Entry], allocs: list[dict[str, Any]], root: bool) -> int:
    args = [a for a in argv if a not in ("-o", "json", "--output=json")]
    if not args or args[0] != "inspect":
        _err("gpusim: crictl: only 'inspect' is simulated")
        return 1
    ids = args[1:]
    if not root:
        _err(
            "FATA[0000] validate service connection: validate CRI v1 runtime API for endpoint "
            '"unix:///run/containerd/containerd.sock": rpc error: code = Unavailable desc = '
            'connection error: desc = "transport: Error while dialing: dial unix '
            '/run/containerd/containerd.sock: connect: permission denied"'
        )
        return 1
    if not ids:
        _err("FATA[0000] ID cannot be empty")
        return 1
    docs = []
    for ref in ids:
        e = _find(entries, ("kubernetes",), ref, names=False)
        if e is None:
            _err(
                "FATA[0000] get container status: rpc error: code = NotFound desc = an error "
                f'occurred when try to find container "{ref}": not found'
            )
            return 1
        docs.append(crictl_doc(e, allocs))
    print(go_json(docs[0] if len(docs) == 1 else docs, 2, sort_keys=True))
    return 0


def _slurm(
    prog: str, argv: list[str], state_dir: str, entries: list[Entry],
    allocs: list[dict[str, Any]], node: str, root: bool,
) -> int:  # fmt: skip
    jobs = {e["id"]: e for e in entries if e["kind"] == "slurm"}
    if prog == "scontrol":
        one_line = "-o" in argv or "--oneliner" in argv
        args = [a for a in argv if a not in ("-o", "--oneliner")]
        if len(args) != 3 or args[0] != "show" or args[1] != "job":
            _err("gpusim: scontrol: only 'show job ID' is simulated")
            return 1
        e = jobs.get(args[2])
        if e is None:
            _err("slurm_load_jobs error: Invalid job id specified")
            return 1
        lines = scontrol_lines(e, allocs, node)
        print(" ".join(ln.strip() for ln in lines) if one_line else "\n".join(lines) + "\n")
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        _err("gpusim: scancel: only 'scancel JOBID...' is simulated")
        return 1
    rc = 0
    for ref in argv:
        e = jobs.get(ref)
        if e is None:
            _err(f"scancel: error: Kill job error on job id {ref}: Invalid job id specified")
            rc = 1
        elif not root and e["job"]["uid"] != os.geteuid():
            _err(f"scancel: error: Kill job error on job id {ref}: Access/permission denied")
            rc = 1
        else:
            stop(state_dir, e, "cancelled", KILL_WAIT_S)
    return rc


def _systemctl(argv: list[str], state_dir: str, entries: list[Entry], root: bool) -> int:
    if len(argv) < 2 or argv[0] != "stop":
        _err("gpusim: systemctl: only 'stop UNIT...' is simulated")
        return 1
    units = {e["id"]: e for e in entries if e["kind"] == "service"}
    rc = 0
    for unit in argv[1:]:
        e = units.get(unit)
        if e is None:
            _err(f"Failed to stop {unit}: Unit {unit} not loaded.")
            rc = 5
        elif not root:
            _err(f"Failed to stop {unit}: Interactive authentication required.")
            rc = rc or 1
        else:
            stop(state_dir, e, "stopped", KILL_WAIT_S)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[3:], sys.argv[2]))
