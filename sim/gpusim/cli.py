"""``gpubot sim up|down|spawn|fault|xid|state``: run and drive a simulated GPU fleet.

``python -m gpusim ACTION`` (``main``) is the same command without gpubot: the fleet daemon
runs as that.

``up`` starts the fleet in a background daemon (its pid file and control socket live in
``--dir``) and prints the path of the inventory it wrote; ``--foreground`` runs it in this
process until SIGTERM or Ctrl-C. The other commands talk to the running fleet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gpusim
from gpusim import simstate
from gpusim.cgroups import KINDS
from gpusim.control import request
from gpusim.errors import SimError, SimUsageError
from gpusim.fleet import SERVERS, SimFleet
from gpusim.node import FAULTS
from gpusim.runtime_registry import RESTARTS
from gpusim.server import check_port_free
from gpusim.workload import BEHAVIOURS

PROG = "gpusim"
PID_FILE = "sim.pid"
LOG_FILE = "sim.log"
UP_TIMEOUT_S = 120.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m gpusim ACTION``; print a one-line error for bad input; return the status."""
    parser = argparse.ArgumentParser(prog=PROG, description="Run and drive a simulated GPU fleet.")
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    try:
        return run(parser.parse_args(argv))
    except SimError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sim`` sub-subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="sim_command", metavar="ACTION", required=True)

    _add_up(sub.add_parser("up", help="start a simulated fleet and write its gpubot.toml"))
    down = sub.add_parser("down", help="stop the fleet and every process it started")
    _dir(down)
    _add_spawn(sub.add_parser("spawn", help="start a workload process on a node's GPU"))
    fault = sub.add_parser("fault", help="make a node's nvidia-smi misbehave (or stop it)")
    _dir(fault)
    fault.add_argument("--node", required=True)
    fault.add_argument("kind", choices=[*FAULTS, "none"])
    fault.add_argument("--delay-s", type=float, default=None, help="delay of the slow fault")
    xid = sub.add_parser("xid", help="write an NVIDIA Xid line to a node's kernel log")
    _dir(xid)
    xid.add_argument("--node", required=True)
    xid.add_argument("--gpu", type=int, default=0)
    xid.add_argument("code", type=int, help="the Xid code (gpusim.kernlog_host.TEMPLATES)")
    state = sub.add_parser("state", help="print the nodes' GPUs and allocations as JSON")
    _dir(state)
    state.add_argument("--node", default=None)


def _add_up(up: argparse.ArgumentParser) -> None:
    """Add the options of ``sim up``."""
    _dir(up)
    up.add_argument("--nodes", type=int, default=4, help="number of nodes (default 4)")
    up.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    up.add_argument(
        "--server",
        choices=SERVERS,
        default="asyncssh",
        help="SSH server: asyncssh in-process (default) or OpenSSH sshd",
    )
    up.add_argument(
        "--release-delay",
        type=float,
        default=1.5,
        metavar="S",
        help="seconds from a process's death to the release of its memory",
    )
    up.add_argument("--model", default="NVIDIA H200", help="GPU model name")
    up.add_argument("--memory-mib", type=int, default=143771, help="memory of each GPU")
    up.add_argument(
        "--port",
        type=int,
        default=None,
        metavar="BASE",
        help="serve node i on port BASE+i-1 (default: free ports)",
    )
    up.add_argument(
        "--runtimes",
        action="store_true",
        help="give every node stand-in docker, podman, crictl, scontrol, scancel and systemctl",
    )
    up.add_argument("--foreground", action="store_true", help="run in this process")


def _add_spawn(spawn: argparse.ArgumentParser) -> None:
    """Add the options of ``sim spawn``."""
    _dir(spawn)
    spawn.add_argument("--node", required=True)
    spawn.add_argument("--gpu", type=int, default=None, help="GPU index (none for ctl-only)")
    spawn.add_argument("--mib", type=int, default=1024)
    spawn.add_argument("--behaviour", choices=BEHAVIOURS, default="normal")
    spawn.add_argument("--user", default=None, help="run as this Linux user (needs root)")
    spawn.add_argument("--name", default="python3", help="process name (argv[0] and comm)")
    spawn.add_argument("--util", type=int, default=50, help="GPU utilisation %% it causes")
    spawn.add_argument("--slow-exit-s", type=float, default=3.0)
    spawn.add_argument(
        "--cgroup",
        metavar="KIND",
        default=None,
        help=f"run it in a fresh real cgroup: {', '.join(KINDS)} (needs root)",
    )
    spawn.add_argument(
        "--container-name",
        metavar="NAME",
        default=None,
        help="docker/podman/kubernetes: the container's name",
    )
    spawn.add_argument("--image", default=None, help="docker/podman/kubernetes: the image")
    spawn.add_argument(
        "--label",
        metavar="KEY=VALUE",
        action="append",
        default=None,
        help="docker/podman/kubernetes: a container label (repeatable)",
    )
    spawn.add_argument(
        "--restart",
        metavar="POLICY",
        default=None,
        help=f"docker/podman: the restart policy ({', '.join(RESTARTS)})",
    )
    spawn.add_argument(
        "--pod", metavar="NAMESPACE/NAME", default=None, help="kubernetes: the container's pod"
    )
    spawn.add_argument("--job-name", default=None, help="slurm: the job's name")
    spawn.add_argument(
        "--job-user",
        metavar="USER",
        default=None,
        help="slurm: the job's user (it runs as that user)",
    )


def _dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, type=Path, help="the fleet directory")


def run(args: argparse.Namespace) -> int:
    """Run one ``gpubot sim`` action; return the exit status."""
    directory: Path = args.dir.absolute()
    action = args.sim_command
    if action == "up":
        return _up_foreground(args, directory) if args.foreground else _up(args, directory)
    if action == "down":
        return _down(directory)
    if action == "spawn":
        req = {
            "op": "spawn",
            "node": args.node,
            "gpu": args.gpu,
            "mib": args.mib,
            "behaviour": args.behaviour,
            "user": args.user,
            "name": args.name,
            "util_pct": args.util,
            "slow_exit_s": args.slow_exit_s,
            "cgroup": args.cgroup,
            "container_name": args.container_name,
            "image": args.image,
            "labels": _labels(args.label),
            "restart": args.restart,
            "pod": args.pod,
            "job_name": args.job_name,
            "job_user": args.job_user,
        }
        print(json.dumps(request(directory, req)))
        return 0
    if action == "fault":
        params: dict[str, Any] = {}
        if args.delay_s is not None:
            if args.kind != "slow":
                raise SimUsageError("--delay-s goes with the slow fault only")
            params["delay_s"] = args.delay_s
        kind = None if args.kind == "none" else args.kind
        result = request(
            directory, {"op": "fault", "node": args.node, "kind": kind, "params": params}
        )
        print(json.dumps(result))
        return 0
    if action == "xid":
        req = {"op": "xid", "node": args.node, "gpu": args.gpu, "code": args.code}
        print(json.dumps(request(directory, req)))
        return 0
    if action == "state":
        print(json.dumps(request(directory, {"op": "state", "node": args.node}), indent=2))
        return 0
    raise SimUsageError(f"unknown sim action {action!r}")


def _labels(given: list[str] | None) -> dict[str, str] | None:
    """Parse ``--label KEY=VALUE`` (repeatable) into a mapping; bad input is a ``SimUsageError``."""
    if given is None:
        return None
    out: dict[str, str] = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SimUsageError(f"--label wants KEY=VALUE, not {item!r}")
        if key in out:
            raise SimUsageError(f"--label {key} given twice")
        out[key] = value
    return out


def _fleet(args: argparse.Namespace, directory: Path, on_stop: Any = None) -> SimFleet:
    return SimFleet(
        directory,
        nodes=args.nodes,
        gpus=args.gpus,
        server=args.server,
        release_delay_s=args.release_delay,
        model=args.model,
        memory_mib=args.memory_mib,
        base_port=args.port,
        on_stop=on_stop,
        runtimes=args.runtimes,
    )


def _running(directory: Path) -> tuple[int, int] | None:
    """Return ``(pid, start ticks)`` of the fleet daemon of ``directory`` if it runs."""
    try:
        pid, ticks = (int(x) for x in (directory / PID_FILE).read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return (pid, ticks) if simstate.is_alive(pid, ticks) else None


def _up(args: argparse.Namespace, directory: Path) -> int:
    _fleet(args, directory)  # validate the arguments here, with one-line errors
    running = _running(directory)
    if running:
        raise SimUsageError(f"a simulated fleet already runs in {directory} (pid {running[0]})")
    if args.port is not None:
        for i in range(args.nodes):
            check_port_free(args.port + i)
    directory.mkdir(parents=True, exist_ok=True)
    argv = _daemon_argv(args, directory)
    env = dict(os.environ)
    here = str(Path(gpusim.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    log_path = directory / LOG_FILE
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # the daemon outlives this command and its terminal
            env=env,
        )
    out = proc.stdout
    assert out is not None
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
    reader.start()
    reader.join(UP_TIMEOUT_S)
    line = box[0].decode().strip() if box else ""
    if line:
        print(line)
        return 0
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        raise SimError(f"the fleet did not start within {UP_TIMEOUT_S:g}s (see {log_path})")
    proc.wait()
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    last = lines[-1] if lines else f"the fleet daemon exited with status {proc.returncode}"
    raise SimError(last.removeprefix(f"{PROG}: error: "))


def _daemon_argv(args: argparse.Namespace, directory: Path) -> list[str]:
    """Return the fleet daemon's command line: ``python -m gpusim up --foreground`` with the
    options of this ``up``."""
    argv = [sys.executable, "-m", "gpusim", "up", "--foreground", "--dir", str(directory)]
    options = {
        "--nodes": args.nodes,
        "--gpus": args.gpus,
        "--server": args.server,
        "--release-delay": args.release_delay,
        "--model": args.model,
        "--memory-mib": args.memory_mib,
        "--port": args.port,
    }
    for opt, value in options.items():
        if value is not None:
            argv += [opt, str(value)]
    return argv + (["--runtimes"] if args.runtimes else [])


def _up_foreground(args: argparse.Namespace, directory: Path) -> int:
    running = _running(directory)
    if running and running[0] != os.getpid():
        raise SimUsageError(f"a simulated fleet already runs in {directory} (pid {running[0]})")
    stop = threading.Event()
    fleet = _fleet(args, directory, on_stop=stop.set)
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pid_file = directory / PID_FILE
    try:
        fleet.start()
        pid_file.write_text(f"{os.getpid()} {simstate.start_ticks(os.getpid())}\n")
        print(fleet.config_path, flush=True)
        if not sys.stdout.isatty():  # whoever read the path may be gone: write nothing more
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        while not stop.wait(0.5):
            pass
    finally:
        fleet.stop()
        with contextlib.suppress(FileNotFoundError):
            if _pid_in(pid_file) == os.getpid():
                pid_file.unlink()
        for s, h in previous.items():
            signal.signal(s, h)
    return 0


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _down(directory: Path) -> int:
    pid_file = directory / PID_FILE
    running = _running(directory)
    if running is None:
        if pid_file.exists():
            pid_file.unlink()
            raise SimUsageError(
                f"no simulated fleet runs in {directory} (removed a stale pid file)"
            )
        raise SimUsageError(f"no simulated fleet runs in {directory}")
    pid, ticks = running
    _send(pid, ticks, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while simstate.is_alive(pid, ticks) and time.monotonic() < deadline:
        time.sleep(0.05)
    if simstate.is_alive(pid, ticks):
        _send(pid, ticks, signal.SIGKILL)
        raise SimError(f"the fleet daemon (pid {pid}) did not stop within 30s: killed it")
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # ours only if we started it (tests do)
    print(f"stopped the simulated fleet in {directory}")
    return 0


def _send(pid: int, ticks: int, sig: int) -> None:
    """Signal the daemon only if ``pid`` is still the process started at ``ticks``."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if simstate.start_ticks(pid) == ticks:
            signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)
