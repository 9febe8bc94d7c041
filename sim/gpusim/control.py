"""The fleet's control socket: ``gpubot sim spawn|fault|state|down`` talk to the running fleet.

One JSON object per line each way over a Unix socket (mode 0600) in the fleet directory. The
process that hosts the fleet spawns every workload, so its driver watches and reaps them all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpusim.errors import SimError, SimUsageError

if TYPE_CHECKING:
    from gpusim.node import SimNode
    from gpusim.spawning import Workload

SOCKET_NAME = "control.sock"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


class ControlledFleet(Protocol):
    """What the control socket drives (``SimFleet``): its inventory and its nodes."""

    @property
    def config_path(self) -> Path:
        """The fleet's gpubot.toml."""
        ...

    @property
    def nodes(self) -> Sequence[SimNode]:
        """Every node, in order."""
        ...

    def node(self, name: str) -> SimNode:
        """Return the node called ``name``; ``SimUsageError`` for an unknown one."""
        ...


def socket_path(directory: Path) -> Path:
    """Return the control socket of the fleet in ``directory`` (short enough for AF_UNIX)."""
    path = directory / SOCKET_NAME
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"gpusim-{digest}.sock"


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(1 << 20)
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise SimUsageError("a request is a JSON object")
            result = self.server.dispatch(req)
            reply: dict[str, Any] = {"ok": True, "result": result}
        except SimError as exc:
            reply = {"ok": False, "error": str(exc), "usage": isinstance(exc, SimUsageError)}
        except (ValueError, TypeError, KeyError) as exc:
            reply = {"ok": False, "error": f"bad request: {exc}", "usage": True}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, dispatch: Callable[[dict[str, Any]], Any]) -> None:
        super().__init__(path, _Handler)
        self.dispatch = dispatch


class ControlServer:
    """Serve the control socket of ``fleet`` at ``path``."""

    def __init__(
        self, path: Path, fleet: ControlledFleet, on_stop: Callable[[], None] | None
    ) -> None:
        self.path = path
        self._fleet = fleet
        self._on_stop = on_stop
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        old = os.umask(0o077)
        try:
            self._server = _Server(str(path), self._dispatch)
        finally:
            os.umask(old)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _dispatch(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        f = self._fleet
        if op == "ping":
            return {"config": str(f.config_path), "pid": os.getpid()}
        if op == "state":
            names = [req["node"]] if req.get("node") else [n.name for n in f.nodes]
            return [f.node(n).state() for n in names]
        if op == "spawn":
            w = f.node(req["node"]).spawn(
                req.get("gpu"),
                mib=int(req.get("mib", 1024)),
                behaviour=str(req.get("behaviour", "normal")),
                user=req.get("user"),
                name=str(req.get("name", "python3")),
                util_pct=int(req.get("util_pct", 50)),
                slow_exit_s=float(req.get("slow_exit_s", 3.0)),
                cgroup=req.get("cgroup"),
                container_name=req.get("container_name"),
                image=req.get("image"),
                labels=req.get("labels"),
                restart=req.get("restart"),
                pod=req.get("pod"),
                job_name=req.get("job_name"),
                job_user=req.get("job_user"),
            )
            out = {
                "node": w.node,
                "pid": w.pid,
                "start_ticks": w.start_ticks,
                "gpu": w.gpu,
                "mib": w.mib,
                "behaviour": w.behaviour,
                "user": w.user,
                "name": w.name,
                "supervisor_pid": w.supervisor_pid,
            }
            if w.cgroup_kind is not None:  # the identity made for it, where it has one
                out.update({k: v for k, v in _identity(w).items() if v not in (None, {})})
            return out
        if op == "fault":
            params = dict(req.get("params") or {})
            f.node(req["node"]).set_fault(req.get("kind"), **params)
            return f.node(req["node"]).state()["fault"]
        if op == "xid":  # one Xid line in the node's kernel log (gpusim.kernlog_host)
            node = f.node(req["node"])
            gpu = int(req["gpu"])
            if not 0 <= gpu < len(node.kernel.bus_ids):
                raise SimUsageError(f"{node.name} has no GPU {gpu}")
            return node.kernel.xid(gpu, int(req["code"]))
        if op == "stop":
            if self._on_stop is None:
                raise SimUsageError("this fleet is run by a program, not by 'gpubot sim up'")
            self._on_stop()
            return None
        raise SimUsageError(f"unknown control operation {op!r}")


def _identity(w: Workload) -> dict[str, Any]:
    return {
        "cgroup_kind": w.cgroup_kind,
        "cgroup_path": w.cgroup_path,
        "cgroup_v1_path": w.cgroup_v1_path,
        "container_id": w.container_id,
        "container_name": w.container_name,
        "image": w.image,
        "labels": w.labels,
        "restart": w.restart,
        "pod_uid": w.pod_uid,
        "pod_namespace": w.pod_namespace,
        "pod_name": w.pod_name,
        "job_id": w.job_id,
        "job_name": w.job_name,
        "job_user": w.job_user,
        "unit": w.unit,
    }


def request(directory: Path, req: dict[str, Any], timeout_s: float = 60.0) -> Any:
    """Send one request to the fleet running in ``directory``; return its result."""
    path = socket_path(directory)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise SimUsageError(
                f"no simulated fleet runs in {directory} (start one: gpubot sim up)"
            ) from None
        sock.sendall(json.dumps(req).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise SimError(f"the fleet in {directory} did not answer in {timeout_s:g}s") from None
    except OSError as exc:  # it hung up while we wrote or read
        raise SimError(f"the fleet in {directory} hung up: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if not data:
        raise SimError(f"the fleet in {directory} closed the connection without an answer")
    reply = json.loads(data)
    if not reply.get("ok"):
        cls = SimUsageError if reply.get("usage") else SimError
        raise cls(str(reply.get("error")))
    return reply.get("result")
