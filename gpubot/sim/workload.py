"""A simulated GPU workload: a real process that holds its GPU's device file and its memory.

Standalone (standard library only): copied into ``<fleet>/lib/gpusim/`` and started through
``<fleet>/lib/gpusim_workload.py`` with the system Python, possibly as another user, with
argv[0] set to the process name the test asked for.

Behaviours: ``normal`` (exits on SIGTERM), ``stubborn`` (ignores SIGTERM), ``slow`` (exits
``slow_exit_s`` after SIGTERM), ``respawn`` (a supervisor that holds no device file restarts a
``normal`` child on the same GPU whenever it dies), ``orphan`` (its memory stays allocated after
death), ``hidden`` (not listed by ``--query-compute-apps``), ``ctl-only`` (holds only
``nvidiactl`` and ``nvidia-uvm``, no GPU memory).

Readiness: once the device files are open and the allocation is registered, the process writes
``ready PID START_TICKS`` to the file descriptor ``--ready-fd`` and closes it.
"""

from __future__ import annotations

import argparse
import mmap
import os
import pwd
import signal
import subprocess
import sys
import time
from types import FrameType

from . import simstate

BEHAVIOURS = ("normal", "stubborn", "slow", "respawn", "orphan", "hidden", "ctl-only")
PAGE = 4096


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse the workload's command line."""
    p = argparse.ArgumentParser(prog="gpusim-workload")
    p.add_argument("--node-dir", required=True)
    p.add_argument("--gpu", type=int, default=-1)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--behaviour", choices=BEHAVIOURS, default="normal")
    p.add_argument("--util", type=int, default=50)
    p.add_argument("--slow-exit-s", type=float, default=3.0)
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--name", default="python3")
    p.add_argument("--exe", default=sys.executable)
    p.add_argument("--supervisor", type=int, default=0)
    p.add_argument("--respawn-delay-s", type=float, default=0.3)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the workload; return its exit status."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.behaviour == "respawn" and not args.supervisor:
        return supervise(args, argv if argv is not None else sys.argv[1:])
    return hold(args)


def hold(args: argparse.Namespace) -> int:
    """Open the device files, register the allocation, then wait for signals."""
    state_dir = args.node_dir
    with simstate.locked(state_dir):
        prefix = simstate.load(state_dir)["dev_prefix"]
    paths = [f"{prefix}ctl", f"{prefix}-uvm"]
    if args.behaviour != "ctl-only":
        paths.insert(0, f"{prefix}{args.gpu}")
    held = []
    for path in paths:
        fd = os.open(path, os.O_RDWR)
        # A CUDA context maps its device files: fuser shows "F...m" like a real one.
        held.append((fd, mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ)))

    stopping: list[float] = []
    if args.behaviour == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.behaviour == "slow":

        def on_term(signum: int, frame: FrameType | None) -> None:
            stopping.append(time.monotonic())

        signal.signal(signal.SIGTERM, on_term)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)

    me = os.getpid()
    ticks = simstate.start_ticks(me)
    record = {
        "pid": me,
        "start_ticks": ticks,
        "gpu": None if args.behaviour == "ctl-only" else args.gpu,
        "mib": 0 if args.behaviour == "ctl-only" else args.mib,
        "util": 0 if args.behaviour == "ctl-only" else args.util,
        "behaviour": args.behaviour,
        "name": args.name,
        "user": pwd.getpwuid(os.geteuid()).pw_name,
        "supervisor": args.supervisor or None,
        "hidden": args.behaviour == "hidden",
        "orphan": args.behaviour == "orphan",
        "registered_at": time.time(),
        "died_at": None,
    }
    with simstate.transaction(state_dir) as state:
        state["allocs"].append(record)
    if args.ready_fd >= 0:
        os.write(args.ready_fd, f"ready {me} {ticks}\n".encode())
        os.close(args.ready_fd)
    while True:
        if stopping:
            time.sleep(max(0.0, stopping[0] + args.slow_exit_s - time.monotonic()))
            return 0
        signal.pause()


def supervise(args: argparse.Namespace, argv: list[str]) -> int:
    """Restart a child on the same GPU whenever it dies, until told to stop."""
    flags = _Flags()
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        flags.stop = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # pass the request on, like a launcher does

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ready_fd = args.ready_fd
    script = sys.argv[0]  # the launcher this supervisor was started through
    while not flags.stopping():
        child_argv = [*_without(argv, "--ready-fd"), "--supervisor", str(os.getpid())]
        fds: tuple[int, ...] = ()
        if ready_fd >= 0:
            child_argv += ["--ready-fd", str(ready_fd)]
            fds = (ready_fd,)
        child = subprocess.Popen(
            [args.name, "-S", script, *child_argv], executable=args.exe, pass_fds=fds
        )
        if ready_fd >= 0:
            os.close(ready_fd)
            ready_fd = -1
        if flags.stopping():
            child.terminate()
        child.wait()
        if not flags.stopping():
            time.sleep(args.respawn_delay_s)
    return 0


class _Flags:
    """Set by a signal handler; read through a call, so that no check is assumed constant."""

    def __init__(self) -> None:
        self.stop = False

    def stopping(self) -> bool:
        return self.stop


def _without(argv: list[str], option: str) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out
