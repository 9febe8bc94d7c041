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

Go-ahead (``--go-fd``): the process first waits for one byte on that file descriptor before it
does anything (its parent moves it into a cgroup meanwhile, so that whatever it starts is born
there); EOF instead means the parent gave up: it exits with status 1.

Forger (``--forge B64``, with any behaviour): a hostile local user's process. Once ready, a
daemon thread loops every ~5 ms for the process's life: it reads every other process's
``/proc/*/cmdline`` for tokens matching ``[0-9a-f]{16,64}`` (secrets in someone's argv) and keeps
the last few, renders the forge text (base64 of UTF-8 on the command line, so that it may hold
NUL bytes) with ``{token}`` replaced by the latest token found (left as is while none is) and
``{pid}`` by its own pid, then rewrites its own argv area in place through ``/proc/self/mem``
(truncated to the area, NUL-padded: the text up to the first NUL is argv[0], newlines and all)
and sets its comm to the first 15 bytes. ``--pad`` (ignored) makes the argv area big enough.
Nothing else changes: the allocation record keeps the ``--name`` it started with.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import mmap
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, BinaryIO

from . import simstate

BEHAVIOURS = (
    "normal",
    "stubborn",
    "slow",
    "respawn",
    "orphan",
    "hidden",
    "ctl-only",
    "persistenced",
)
GPULESS = ("ctl-only", "persistenced")  # hold no GPU memory of their own
PAGE = 4096
FORGE_PERIOD_S = 0.005
TOKEN = re.compile(rb"[0-9a-f]{16,64}")
PR_SET_NAME = 15
COMM_LEN = 15  # the kernel keeps 15 bytes of a comm (16 with the NUL)


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
    p.add_argument("--go-fd", type=int, default=-1)
    p.add_argument("--name", default="python3")
    p.add_argument("--exe", default=sys.executable)
    p.add_argument("--supervisor", type=int, default=0)
    p.add_argument("--respawn-delay-s", type=float, default=0.3)
    p.add_argument("--forge", type=_b64, default=None, help="forge text, base64 of UTF-8")
    p.add_argument("--pad", default="", help="ignored: room in the argv area for --forge")
    return p.parse_args(argv)


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise argparse.ArgumentTypeError("not base64") from None


def _user_name() -> str:
    """Return our user's name: the host's, else (one of the fleet's people) what USER says."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.geteuid())


def main(argv: list[str] | None = None) -> int:
    """Run the workload; return its exit status."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.go_fd >= 0:
        go = os.read(args.go_fd, 1)
        os.close(args.go_fd)
        if go != b"g":
            return 1
    if args.behaviour == "respawn" and not args.supervisor:
        return supervise(args, argv if argv is not None else sys.argv[1:])
    return hold(args)


def hold(args: argparse.Namespace) -> int:
    """Open the device files, register the allocation, then wait for signals."""
    state_dir = args.node_dir
    with simstate.locked(state_dir):
        state = simstate.load(state_dir)
    prefix = state["dev_prefix"]
    paths = [f"{prefix}ctl", f"{prefix}-uvm"]
    if args.behaviour not in GPULESS:  # the GPU's device file is named by its minor, not index
        paths.insert(0, f"{prefix}{simstate.minor(state, args.gpu)}")
    held = [_open(path) for path in paths]
    if args.behaviour == "persistenced":  # the daemon keeps every GPU's device file open
        return persist(args, state_dir, state, held)

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
        "gpu": None if args.behaviour in GPULESS else args.gpu,
        "mib": 0 if args.behaviour in GPULESS else args.mib,
        "util": 0 if args.behaviour in GPULESS else args.util,
        "behaviour": args.behaviour,
        "name": args.name,
        "user": _user_name(),
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
    if args.forge is not None:
        start_forger(args.forge)
    while True:
        if stopping:
            time.sleep(max(0.0, stopping[0] + args.slow_exit_s - time.monotonic()))
            return 0
        signal.pause()


def _open(path: str) -> tuple[int, mmap.mmap]:
    fd = os.open(path, os.O_RDWR)
    # A CUDA context maps its device files: fuser shows "F...m" like a real one.
    return fd, mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ)


def persist(args: argparse.Namespace, state_dir: str, state: simstate.State, ctl: list[Any]) -> int:
    """Be nvidia-persistenced: hold every GPU's device file while its persistence mode is on.

    ``nvidia-smi -pm 0 -i N`` turns GPU N's mode off (the state says so): the daemon lets its
    device file go within 0.1 s, and takes it again at ``-pm 1``. It holds no memory and is not
    a compute app (NVIDIA's driver README: the daemon keeps the device files open).
    """
    prefix = state["dev_prefix"]
    files = {g["index"]: f"{prefix}{simstate.minor(state, g['index'])}" for g in state["gpus"]}
    held: dict[int, Any] = {i: _open(p) for i, p in files.items()}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    me = os.getpid()
    ticks = simstate.start_ticks(me)
    if args.ready_fd >= 0:
        os.write(args.ready_fd, f"ready {me} {ticks}\n".encode())
        os.close(args.ready_fd)
    while True:
        with simstate.locked(state_dir):
            modes = simstate.load(state_dir).get("persistence", {})
        for i, path in files.items():
            on = modes.get(str(i), 1) == 1
            if on and i not in held:
                held[i] = _open(path)
            elif not on and i in held:
                fd, mm = held.pop(i)
                mm.close()
                os.close(fd)
        done = {str(i): int(i in held) for i in files}
        with simstate.transaction(state_dir) as now:  # what nvidia-smi -pm waits for
            if now.get("persistence_done") != done:
                now["persistence_done"] = done
        time.sleep(0.05)


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
        own = _without(_without(argv, "--ready-fd"), "--go-fd")
        child_argv = [*own, "--supervisor", str(os.getpid())]
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


# ---- the forger -----------------------------------------------------------------------------


def start_forger(template: bytes) -> threading.Thread:
    """Start the daemon thread that keeps this process's argv and comm set to the forge text."""
    # A process-directed signal goes to any thread that does not block it; one caught by the
    # forger would never wake the main thread's pause(): the forger blocks them all.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        t = threading.Thread(target=forge_loop, args=(template,), name="forger", daemon=True)
        t.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return t


def forge_loop(template: bytes) -> None:
    """Hunt tokens in other processes' argv and show the rendered payload, forever."""
    me = os.getpid()
    start, end = argv_area(me)
    found: collections.deque[bytes] = collections.deque(maxlen=8)
    shown: bytes | None = None
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        while True:
            for token in scan_tokens(me):
                if token not in found:
                    found.append(token)
            payload = render(template, found[-1] if found else None, me)
            if payload != shown:
                set_comm(me, payload[:COMM_LEN])  # first: a changed argv means both changed
                write_argv(mem, start, end, payload)
                shown = payload
            time.sleep(FORGE_PERIOD_S)


def render(template: bytes, token: bytes | None, pid: int) -> bytes:
    """Return the payload: ``{token}`` and ``{pid}`` of the template filled in."""
    out = template if token is None else template.replace(b"{token}", token)
    return out.replace(b"{pid}", str(pid).encode())


def scan_tokens(me: int) -> list[bytes]:
    """Return the hex tokens in the command lines of every process but ``me``."""
    out: list[bytes] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone, or not ours to read
        out.extend(TOKEN.findall(raw))
    return out


def argv_area(pid: int) -> tuple[int, int]:
    """Return ``(arg_start, arg_end)`` of ``pid``: fields 48 and 49 of ``/proc/PID/stat``."""
    rest = simstate.stat_fields(pid)
    if rest is None:
        raise OSError(f"cannot read /proc/{pid}/stat")
    return int(rest[48 - 3]), int(rest[49 - 3])


def write_argv(mem: BinaryIO, start: int, end: int, payload: bytes) -> None:
    """Overwrite the argv area with ``payload``, truncated and NUL-padded to fill it."""
    # The last byte stays NUL: a non-NUL one makes the kernel read on into the environment.
    room = end - start - 1
    data = payload[:room].ljust(end - start, b"\0")
    mem.seek(start)
    mem.write(data)


def set_comm(pid: int, name: bytes) -> None:
    """Set the comm of the forger thread (prctl) and of the main thread (which ps shows)."""
    import ctypes  # only forgers need it

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    # PR_SET_NAME names only the calling thread; /proc/PID/comm is the main thread's.
    with open(f"/proc/{pid}/task/{pid}/comm", "wb", buffering=0) as f:
        f.write(name)
