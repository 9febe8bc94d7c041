"""The stand-in ``docker``, ``podman`` and ``crictl``: inspect and stop the registry's containers.

Standalone (standard library only, relative imports only); ``runtimes`` documents the formats and
where each comes from.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

from .runtime_registry import Entry, err, live, stop

DOCKER_STOP_S = 10.0
ZERO_TIME = "0001-01-01T00:00:00Z"


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


def container_cli(
    prog: str,
    argv: list[str],
    state_dir: str,
    entries: list[Entry],
    allocs: list[dict[str, Any]],
    root: bool,
) -> int:
    """``docker|podman [container] inspect|stop ...``: answer from ``entries``; the exit code."""
    args = argv[1:] if argv[:1] == ["container"] else argv
    if not args or args[0] not in ("inspect", "stop"):
        err(f"gpusim: {prog}: only 'inspect' and 'stop' are simulated")
        return 1 if prog == "docker" else 125
    verb = args[0]
    parsed = _container_args(prog, verb, args[1:])
    if parsed is None:
        return 125 if prog == "podman" else 1
    grace, refs = parsed
    if prog == "docker" and not root:
        err(
            "permission denied while trying to connect to the Docker daemon socket at "
            'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.45/'
            f'containers/{refs[0]}/json": dial unix /var/run/docker.sock: connect: '
            "permission denied"
        )
        return 1
    visible = entries if root else []  # rootless podman sees only its own: none are
    found = [(r, _find(visible, (prog,), r, names=True)) for r in refs]
    if verb == "inspect":
        return _inspect(prog, found, allocs)
    return _stop(prog, found, state_dir, grace)


def _container_args(prog: str, verb: str, rest: list[str]) -> tuple[float, list[str]] | None:
    """Return ``(stop grace, refs)`` of an inspect/stop command line; None (said why) if bad."""
    grace = DOCKER_STOP_S
    refs: list[str] = []
    while rest:
        a, rest = rest[0], rest[1:]
        if verb == "stop" and a in ("-t", "--time") and rest:
            try:
                grace = float(rest[0])
            except ValueError:
                err(f'invalid argument "{rest[0]}" for "-t, --time" flag')
                return None
            rest = rest[1:]
        elif verb == "inspect" and a == "--type" and rest[:1] == ["container"]:
            rest = rest[1:]
        elif verb == "inspect" and a == "--type=container":
            pass
        elif a.startswith("-"):
            err(f"gpusim: {prog} {verb}: option {a} is not simulated")
            return None
        else:
            refs.append(a)
    if not refs:
        err(f'"{prog} {verb}" requires at least 1 argument.')
        return None
    return grace, refs


def _inspect(prog: str, found: list[tuple[str, Entry | None]], allocs: list[dict[str, Any]]) -> int:
    """Print ``docker|podman inspect``'s array of what was found, and an error for the rest."""
    docs = [
        (docker_doc if prog == "docker" else podman_doc)(e, allocs)
        for _, e in found
        if e is not None
    ]
    if prog == "docker":
        print(go_json(docs, 4))
        for r, e in found:
            if e is None:
                err(f"Error: No such object: {r}")
        return 1 if any(e is None for _, e in found) else 0
    print(go_json(docs, 5, escape_html=False))
    missing = [r for r, e in found if e is None]
    for r in missing[1:]:
        err(f'error inspecting object: no such object: "{r}"')
    if missing:
        err(f'Error: inspecting object: no such object: "{missing[0]}"')
        return 125
    return 0


def _stop(prog: str, found: list[tuple[str, Entry | None]], state_dir: str, grace: float) -> int:
    """Stop each container found for good, printing its reference; an error for the rest."""
    rc = 0
    for r, e in found:
        if e is None:
            if prog == "docker":
                err(f"Error response from daemon: No such container: {r}")
                rc = 1
            else:
                err(f'Error: no container with name or ID "{r}" found: no such container')
                rc = 125
            continue
        stop(state_dir, e, "stopped", grace)
        print(r, flush=True)
    return rc


def crictl(argv: list[str], entries: list[Entry], allocs: list[dict[str, Any]], root: bool) -> int:
    """``crictl inspect ID...``: the status of the registry's Kubernetes containers."""
    args = [a for a in argv if a not in ("-o", "json", "--output=json")]
    if not args or args[0] != "inspect":
        err("gpusim: crictl: only 'inspect' is simulated")
        return 1
    ids = args[1:]
    if not root:
        err(
            "FATA[0000] validate service connection: validate CRI v1 runtime API for endpoint "
            '"unix:///run/containerd/containerd.sock": rpc error: code = Unavailable desc = '
            'connection error: desc = "transport: Error while dialing: dial unix '
            '/run/containerd/containerd.sock: connect: permission denied"'
        )
        return 1
    if not ids:
        err("FATA[0000] ID cannot be empty")
        return 1
    docs = []
    for ref in ids:
        e = _find(entries, ("kubernetes",), ref, names=False)
        if e is None:
            err(
                "FATA[0000] get container status: rpc error: code = NotFound desc = an error "
                f'occurred when try to find container "{ref}": not found'
            )
            return 1
        docs.append(crictl_doc(e, allocs))
    print(go_json(docs[0] if len(docs) == 1 else docs, 2, sort_keys=True))
    return 0
