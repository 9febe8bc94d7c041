"""The probe's cost on one node, usual and hostile: ``python -m benchmarks.probe_cost``.

::

    python -m benchmarks.probe_cost --holders 200 --repeat 3    # as root (holders run as nobody)

One simulated node (2 GPUs, 2 GPU processes), its probe run here by ``bash`` (no SSH: the remote
work alone), in three cases: the usual node; the same plus ``--holders`` processes that hold only
``nvidiactl``/``nvidia-uvm`` with 4 KiB of non-ASCII argv each (such holders once stalled the
probe); and the same number holding GPU 0's device file instead (read from ``/proc``, so the
escaping's cost shows). Each case runs the probe as it is and, side by side, the probe of commit
``BASELINE`` (before its guards against such holders), which is killed at ``--baseline-timeout``
seconds. The figure is the median wall time of ``--repeat`` runs; every run's output is checked to
end with the end marker (or the budget's "over" marker).

``--processes 100,1000,5000``: the probe's CPU on a node with that many more processes
(``sleep``, nobody's when run as root), side by side with the two bare nvidia-smi queries it
runs, in four forms: a status whose memory adds up (no ``fuser``, stuck queries from the records
in a private runtime folder), the same probe asked for holders (a reset, a sweep), the walk
(no records folder) with ``fuser``, and the probe of ``BEFORE_24`` (before it kept records, when
it walked ``/proc``). CPU is the children's ``getrusage`` (user + system) over ``--repeat``
rounds, median; a probe form's "extra" (its CPU less the bare queries') and its ratio to them are
the medians of each round's pair.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import fmt_ms, fmt_s, table
from gpubot.config import load
from gpubot.core.probe.holders import Holders
from gpubot.core.probe.nvsmi import apps_query_argv, gpu_query_argv
from gpubot.core.probe.snapshot import probe_argv
from gpusim.fleet import SimFleet

BASELINE = "63a07c8"  # the last commit before the probe's guards against hostile holders
BEFORE_24 = "e95a09a"  # the last commit before the probe kept records of its queries
T = 9.0  # each query's limit under the default 20 s command timeout


def baseline_script(repo: Path, commit: str = BASELINE) -> str | None:
    """Return the probe script of ``commit``, or None without git history."""
    if commit == BEFORE_24:  # its script imports its guards: both files of that commit
        guards = _git_show(repo, commit, "gpubot/core/probe/guards.py")
        script = _git_show(repo, commit, "gpubot/core/probe/script.py")
        if guards is None or script is None:
            return None
        ns: dict[str, Any] = {}
        exec(compile(guards, "probe_guards@" + commit, "exec"), ns)
        script = script.replace("from gpubot.core.probe.guards import STUCK, WATCHDOG\n", "")
        exec(compile(script, "probe_script@" + commit, "exec"), ns)
        return str(ns["PROBE_SCRIPT"])
    text = _git_show(repo, commit, "gpubot/core/probe/script.py")
    if text is None:
        return None
    ns = {}
    exec(compile(text, "probe_script@baseline", "exec"), ns)
    return str(ns["PROBE_SCRIPT"])


def _git_show(repo: Path, commit: str, path: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "show", f"{commit}:{path}"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def nonascii(n: int = 4096) -> bytes:
    """``n`` bytes of UTF-8 text (Latin, Greek, CJK): almost no byte is ASCII."""
    text = "".join(
        chr(c) for c in [*range(0xC0, 0x250), *range(0x391, 0x3C9), *range(0x4E00, 0x4F00)]
    )
    return (text * 4).encode()[:n].decode("utf-8", "ignore").encode()


def holders(files: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``sleep`` processes of nobody's holding ``files``, 4 KiB non-ASCII argv."""
    fds = [os.open(f, os.O_RDWR) for f in files]
    try:
        return [
            subprocess.Popen(
                [nonascii(), "600"],
                executable="/bin/sleep",
                pass_fds=fds,
                user="nobody" if os.geteuid() == 0 else None,
                stdin=subprocess.DEVNULL,
            )
            for _ in range(count)
        ]
    finally:
        for fd in fds:
            os.close(fd)


def once(argv: list[str], timeout: float) -> float | None:
    """Return one run's wall time; None when it ran past ``timeout`` (killed)."""
    t = time.monotonic()
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return None
    took = time.monotonic() - t
    if "\n@gpubot end" not in p.stdout:
        raise SystemExit(f"probe output without its end marker: {p.stdout[-300:]!r} {p.stderr!r}")
    return took


def measure(argvs: dict[str, list[str]], repeat: int, cap: float) -> dict[str, str]:
    out = {}
    for name, argv in argvs.items():
        runs = [once(argv, cap if name == "before" else 60.0) for _ in range(repeat)]
        done = [r for r in runs if r is not None]
        out[name] = (
            fmt_s(statistics.median(done)) if len(done) == len(runs) else f"> {cap:g} (killed)"
        )
    return out


def run(count: int = 200, repeat: int = 3, baseline_timeout: float = 60.0) -> list[str]:
    """Measure every case, before and after; return the report's Markdown lines."""
    old = baseline_script(Path(__file__).resolve().parent.parent)
    rows = []
    with tempfile.TemporaryDirectory() as work, SimFleet(work, nodes=1, gpus=2) as fleet:
        node = fleet.node("node1")
        cfg = load(fleet.config_path).node("node1")
        assert cfg is not None
        jobs = [node.spawn(gpu=0, mib=1000), node.spawn(gpu=1, mib=2000)]
        new = probe_argv(cfg, smi_timeout_s=T)
        before = [*new[:12], *new[15:]]  # no budget, holders or records arguments then
        if old is not None:
            before[2] = old
        cases = {
            "usual (2 GPU processes)": [],
            f"+ {count} ctl-only holders, 4 KiB non-ASCII argv": [
                f"{cfg.dev_prefix}ctl",
                f"{cfg.dev_prefix}-uvm",
            ],
            f"+ {count} holders of GPU 0's file, 4 KiB non-ASCII argv": [node.device(0)],
        }
        for case, files in cases.items():
            extra = holders(files, count) if files else []
            try:
                argvs = {"after": new, **({"before": before} if old is not None else {})}
                got = measure(argvs, repeat, baseline_timeout)
                rows.append([case, got.get("before", "-"), got["after"]])
                print(f"{case}: {got}", file=sys.stderr, flush=True)
            finally:
                for h in extra:
                    h.kill()
                    h.wait()
        for j in jobs:
            os.kill(j.pid, 9)
    return [
        f"### The probe's cost on one node (median of {repeat}, seconds)",
        "",
        table(["case", f"before ({BASELINE})", "after"], rows),
        "",
    ]


def cpu_once(argv: list[str]) -> float:
    """Return one run's CPU (it and the children it waited for, user + system), checked."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, start_new_session=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if argv[0] == "bash" and "\n@gpubot end" not in p.stdout:
        raise SystemExit(f"probe output without its end marker: {p.stdout[-300:]!r} {p.stderr!r}")
    if argv[0] != "bash" and p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {p.stderr[-300:]!r}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu(forms: dict[str, list[list[str]]], repeat: int) -> dict[str, list[float]]:
    """Return each form's CPU in each of ``repeat`` rounds (one run of its argvs), the forms
    interleaved in each round: a shared box's drift falls on all of them alike."""
    runs: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeat):
        for name, argvs in forms.items():
            runs[name].append(sum(cpu_once(a) for a in argvs))
    return runs


def paired(form: list[float], base: list[float]) -> tuple[float, float, float]:
    """Return a form's median CPU, and the medians of its extra over ``base`` and of its ratio
    to it, each taken round by round: a form and the bare queries of one round ran moments
    apart, so the box's drift from round to round cancels in each pair."""
    extra = statistics.median(f - b for f, b in zip(form, base, strict=True))
    ratio = statistics.median(f / b for f, b in zip(form, base, strict=True))
    return statistics.median(form), extra, ratio


def sleepers(count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``sleep`` processes (nobody's when run as root): a busy node's others."""
    return [
        subprocess.Popen(
            ["sleep", "600"],
            user="nobody" if os.geteuid() == 0 else None,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def by_processes(counts: list[int], repeat: int = 5) -> list[str]:
    """Measure the probe's CPU against the bare queries at each process count; Markdown lines."""
    before = baseline_script(Path(__file__).resolve().parent.parent, BEFORE_24)
    rows = []
    with tempfile.TemporaryDirectory() as work, SimFleet(work, nodes=1, gpus=2) as fleet:
        node = fleet.node("node1")
        cfg = load(fleet.config_path).node("node1")
        assert cfg is not None
        user = "nobody" if os.geteuid() == 0 else None  # a user's jobs, as on a real node
        jobs = [node.spawn(gpu=0, mib=1000, user=user), node.spawn(gpu=1, mib=2000, user=user)]
        runtime = Path(work) / "run-user"  # stands for /run/user/UID: the account's own, 0700
        runtime.mkdir(mode=0o700)
        bare = [gpu_query_argv(cfg.nvidia_smi), apps_query_argv(cfg.nvidia_smi)]
        forms = {
            "status": probe_argv(
                cfg, smi_timeout_s=T, holders=Holders.IF_UNEXPLAINED, state_dir=str(runtime)
            ),
            "holders": probe_argv(cfg, smi_timeout_s=T, state_dir=str(runtime)),
            "walk+fuser": probe_argv(cfg, smi_timeout_s=T, state_dir=""),
        }
        if before is not None:
            old = forms["walk+fuser"][:13] + forms["walk+fuser"][15:]  # no hold, no folder
            old[2] = before
            forms[f"before ({BEFORE_24})"] = old
        cpu_once(forms["status"])  # the folder's first probe walks /proc once: not measured
        extra: list[subprocess.Popen[bytes]] = []
        try:
            for n in counts:
                extra += sleepers(n - len(extra))
                time.sleep(1.0)
                got = cpu({"bare": bare, **{k: [v] for k, v in forms.items()}}, repeat)
                base = got.pop("bare")
                procs = sum(1 for d in os.listdir("/proc") if d.isdigit())
                row = [f"+{n} ({procs} in all)", fmt_ms(statistics.median(base))]
                for v in got.values():
                    med, more, ratio = paired(v, base)
                    row.append(f"{fmt_ms(med)} (+{fmt_ms(more)}, {ratio:.2f}x)")
                rows.append(row)
                print(f"{n}: {row}", file=sys.stderr, flush=True)
        finally:
            for h in extra:
                h.kill()
            for h in extra:
                h.wait()
            for j in jobs:
                os.kill(j.pid, 9)
    return [
        f"### The probe's CPU by the node's process count (median of {repeat}, ms)",
        "",
        table(["processes", "two bare queries", *forms], rows),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the probe's cost benchmark alone; print its table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.probe_cost")
    p.add_argument("--holders", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline-timeout", type=float, default=60.0)
    p.add_argument(
        "--processes",
        metavar="N,N,...",
        help="instead: the probe's CPU at these extra process counts (e.g. 100,1000,5000)",
    )
    a = p.parse_args(argv)
    if a.processes:
        try:
            counts = sorted(int(x) for x in a.processes.split(","))
        except ValueError:
            p.error(f"--processes {a.processes!r}: expected numbers separated by commas")
        if not counts or counts[0] < 0:
            p.error("--processes: counts must be 0 or more")
        print("\n".join(by_processes(counts, a.repeat)))
        return 0
    print("\n".join(run(a.holders, a.repeat, a.baseline_timeout)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
