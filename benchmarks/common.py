"""Shared helpers of the benchmarks: timed subprocesses, CPU accounting, medians, tables."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """One timed run of one method: wall seconds and CPU seconds (client, and server side)."""

    wall: float
    cpu: float
    server_cpu: float | None = None
    ok: bool = True
    note: str = ""


@dataclass
class Series:
    """All runs of one method at one fleet size."""

    method: str
    nodes: int
    samples: list[Sample] = field(default_factory=list)
    missing: str = ""  # why the method could not run at all ("not installed", ...)

    def ok_samples(self) -> list[Sample]:
        """Return the runs that did the whole job."""
        return [s for s in self.samples if s.ok]

    def median_wall(self) -> float | None:
        """Return the median wall time of the good runs."""
        ok = self.ok_samples()
        return statistics.median(s.wall for s in ok) if ok else None

    def median_cpu(self) -> float | None:
        """Return the median client CPU seconds of the good runs."""
        ok = self.ok_samples()
        return statistics.median(s.cpu for s in ok) if ok else None

    def median_server_cpu(self) -> float | None:
        """Return the median server-side CPU seconds of the good runs (None if not measured)."""
        vals = [s.server_cpu for s in self.ok_samples() if s.server_cpu is not None]
        return statistics.median(vals) if vals else None

    def failures(self) -> list[str]:
        """Return the notes of the runs that failed."""
        return [s.note for s in self.samples if not s.ok]


def rusage_cpu(ru: resource.struct_rusage) -> float:
    """Return user + system seconds of a rusage."""
    return ru.ru_utime + ru.ru_stime


def self_cpu() -> float:
    """Return the CPU seconds this process and its waited-for children used so far."""
    return rusage_cpu(resource.getrusage(resource.RUSAGE_SELF)) + rusage_cpu(
        resource.getrusage(resource.RUSAGE_CHILDREN)
    )


def rss_kib(pid: int | str = "self") -> int:
    """Return the resident set size of a process in KiB (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int | str = "self") -> int:
    """Return how many file descriptors a process holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Finished:
    """A subprocess that ran to its end, with its own CPU use (descendants it waited for incl.)."""

    returncode: int
    stdout: str
    stderr: str
    wall: float
    cpu: float


def run_timed(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    cwd: Path | None = None,
) -> Finished:
    """Run ``argv``, return its output, wall time and CPU seconds (from ``wait4``)."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpubot-bench-{os.getpid()}.out"
    err_path = out_path.with_suffix(".err")
    with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env) if env is not None else None,
            cwd=cwd or REPO,
        )
        deadline = started + timeout
        while True:
            # wait4 gives the rusage of exactly this child (and what it waited for).
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() > deadline:
                proc.kill()  # our own child, by pid
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.002)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text_out = out.read().decode("utf-8", "replace")
        text_err = err.read().decode("utf-8", "replace")
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return Finished(proc.returncode, text_out, text_err, wall, rusage_cpu(ru))


# ---- server-side CPU: every process under the fleet's sshd listeners ------------------------


def sshd_listeners(parent: int | None = None) -> list[int]:
    """Return the PIDs of the sshd daemons that ``parent`` (default: this process) started."""
    parent = os.getpid() if parent is None else parent
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            with open(f"/proc/{name}/comm", encoding="utf-8") as c:
                comm = c.read().strip()
        except OSError:
            continue
        ppid = int(data[data.rindex(b")") + 2 :].split()[1])
        if ppid == parent and comm.startswith("sshd"):
            out.append(int(name))
    return out


class ServerMeter:
    """CPU used on the server side: the sshd listeners and everything they start.

    The listeners go into their own cgroup (v1 ``cpuacct``), which every session and remote
    command inherits, so its usage counts them all, reaped or not. Needs root and a writable
    cpuacct hierarchy; otherwise ``usage()`` is None and the column stays empty.
    """

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, pids: Sequence[int]) -> None:
        self.path: Path | None = self.ROOT / f"gpubot-bench-{os.getpid()}-{time.monotonic_ns()}"
        try:
            self.path.mkdir()
            for pid in pids:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            self._remove()
            self.path = None

    def usage(self) -> float | None:
        """Return the CPU seconds used in the group so far (None without a group)."""
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def count(self) -> int:
        """Return how many processes are in the group."""
        if self.path is None:
            return 0
        return len((self.path / "cgroup.procs").read_text().split())

    def settle(self, count: int, timeout: float = 3.0) -> None:
        """Wait until the group is back to ``count`` processes (sessions closed)."""
        deadline = time.monotonic() + timeout
        while self.count() > count and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Move what is left back to the parent group and remove ours."""
        self._remove()
        self.path = None

    def _remove(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # exited meanwhile
                    (self.ROOT / "cgroup.procs").write_text(f"{pid}\n")
            self.path.rmdir()
        except OSError:
            pass


class FleetYields:
    """Put the fleet's sshd listeners (and so every session and command they start) in a v1
    ``cpu`` cgroup with the smallest weight (``cpu.shares`` 2 against the default 1024).

    On a real deployment the bot has its own host: the nodes' work never takes its CPU. Here
    every simulated node shares this box's 2 cores with the bot, so a burst's fleet work would
    starve the bot's event loop of CPU and delay acknowledgements for reasons that are the
    simulation's, not gpubot's. With the fleet yielding, the bot runs whenever it has work and
    the fleet gets the rest. Needs root and the ``cpu`` hierarchy; ``applied`` says if it was.
    """

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, pids: Sequence[int], shares: int = 2) -> None:
        self.path: Path | None = self.ROOT / f"gpubot-bench-yield-{os.getpid()}"
        try:
            self.path.mkdir()
            (self.path / "cpu.shares").write_text(f"{shares}\n")
            for pid in pids:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            self.close()

    @property
    def applied(self) -> bool:
        """Whether the fleet's servers now yield the CPU."""
        return self.path is not None

    def close(self, timeout: float = 5.0) -> None:
        """Move every process back to the root group and remove ours (a session that was still
        closing, or not yet reaped, keeps the group busy for a moment: try again until
        ``timeout``)."""
        if self.path is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):  # exited meanwhile
                        (self.ROOT / "cgroup.procs").write_text(f"{pid}\n")
                self.path.rmdir()
            if not self.path.exists() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.path = None


# ---- reporting --------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    """Describe this machine: cores, CPU model, memory, kernel, Python, load."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kib = int(f.readline().split()[1])
            mem = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load": load,
    }


def fmt_s(x: float | None, digits: int = 3) -> str:
    """Format seconds (or '-' for missing)."""
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_ms(x: float | None) -> str:
    """Format seconds as milliseconds (or '-')."""
    return "-" if x is None else f"{x * 1000:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return a Markdown table, columns padded for a terminal."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def percentile(values: Sequence[float], pct: float) -> float:
    """Return the ``pct`` percentile (nearest rank) of ``values``."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, int(-(-pct * len(ordered) // 100)))  # ceil(pct/100 * n), at least 1
    return ordered[min(rank, len(ordered)) - 1]
