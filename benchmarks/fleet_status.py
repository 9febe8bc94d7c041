"""Fleet status, side by side: gpubot cold and warm against the tools an admin reaches for.

Every method does at least the two nvidia-smi queries on every node of the same simulated fleet
(one OpenSSH ``sshd`` per node) and its output is checked (every node, every GPU), so a method
cannot look fast by failing. The baselines run ONE remote command per node: the GPU query, then
the compute-apps query. gpubot runs its probe instead: one exec that does both queries (each
under ``timeout``), ``fuser -v`` on the GPU device files and reads ``/proc`` for every holder.

Within one repeat the methods run one after another, in an order that rotates every repeat.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    PYTHON,
    REPO,
    Finished,
    Sample,
    Series,
    ServerMeter,
    run_timed,
    sshd_listeners,
    table,
)
from benchmarks.worker import baseline_command, check_baseline_output, remote_command
from gpubot.config import load
from gpubot.core.probe.nvsmi import GPU_FIELDS
from gpusim.fleet import SimFleet

METHODS = (
    "ssh-seq",  # sequential OpenSSH loop
    "ssh-xargs",  # the same with xargs -P N
    "pssh",  # parallel-ssh (ParallelSSHClient), a fresh process per run
    "ansible",  # ansible ad-hoc -m shell -f N
    "asyncssh-cold",  # a minimal asyncssh script, a new process: connect, run, exit
    "asyncssh-floor",  # minimal asyncssh over already-open connections
    # The same three running gpubot's probe instead of the two queries: equal remote work, so the
    # ratio is gpubot's own client-side cost (every simulated node shares this box's 2 cores).
    "pssh:probe",
    "asyncssh-cold:probe",
    "asyncssh-floor:probe",
    "gpubot-cold",  # gpubot status all --json, a new process
    "gpubot-warm",  # a running gpubot, pooled connections
    "gpubot-sweep",  # a running gpubot's scheduled sweep (probe, find, record, alert state)
    "gpubot-warm:smi-only",  # diagnostic: gpubot warm with a probe cut to the two queries
)
SLOW = ("ssh-seq", "ansible")  # capped repeats (see ``slow_repeat``)

# ``asyncssh-cold``: what a person writes with asyncssh to ask every node once. Run as a new
# Python process each time, like ``gpubot status``; host keys checked against known_hosts.
ASYNCSSH_COLD = """\
import asyncio, json, sys

from gpubot.transport.sshlib import asyncssh


async def one(spec, node):
    async with asyncssh.connect(
        "127.0.0.1", node["port"], username=spec["user"], client_keys=[spec["key"]],
        known_hosts=spec["known_hosts"], agent_path=None, config=None,
    ) as conn:
        return await conn.run(node["command"])


async def main(path):
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    results = await asyncio.gather(*(one(spec, n) for n in spec["nodes"]),
                                   return_exceptions=True)
    bad = 0
    for r in results:
        if isinstance(r, BaseException) or r.exit_status != 0:
            print(repr(r), file=sys.stderr)
            bad += 1
        else:
            sys.stdout.write(r.stdout)
    return 1 if bad else 0


sys.exit(asyncio.run(main(sys.argv[1])))
"""

SSH_OPTS = (
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "BatchMode=yes",
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    "-o",
    "IdentitiesOnly=yes",
    "-F",
    "/dev/null",
)


def warm_spec(method: str) -> tuple[str, str, str] | None:
    """Return (worker kind, experiment, round) of a warm method, None for a cold one."""
    if method == "asyncssh-floor":
        return ("asyncssh", "", "round")
    if method == "asyncssh-floor:probe":
        return ("asyncssh", "probe", "round")
    if method == "gpubot-warm":
        return ("gpubot", "", "round")
    if method == "gpubot-sweep":
        return ("gpubot", "", "sweep")
    if method.startswith("gpubot-warm:"):
        return ("gpubot", method.split(":", 1)[1], "round")
    return None


def installed(method: str) -> str:
    """Return '' if ``method`` can run here, else why not ('not installed: ...')."""
    if method.startswith("pssh") and importlib.util.find_spec("pssh") is None:
        return "not installed (pip install parallel-ssh)"
    if method == "ansible" and not _ansible_bin():
        return "not installed (pip install ansible-core)"
    if method.startswith("ssh-") and not shutil.which("ssh"):
        return "not installed (openssh-client)"
    if method == "ssh-xargs" and not shutil.which("xargs"):
        return "not installed (findutils)"
    return ""


def _ansible_bin() -> str | None:
    here = Path(PYTHON).parent / "ansible"
    return str(here) if here.exists() else shutil.which("ansible")


@dataclass
class Warm:
    """A running worker process (gpubot warm or the asyncssh floor)."""

    proc: subprocess.Popen[str]
    ready: dict[str, Any]
    last: dict[str, Any] = field(default_factory=dict)

    def round(self, what: str = "round") -> dict[str, Any]:
        """Ask for one timed round (or sweep); return its JSON report."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{what}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args!r} died")
        report: dict[str, Any] = json.loads(line)
        self.last = report
        return report

    def close(self) -> None:
        """Tell the worker to quit and wait for it (killed by pid if it hangs)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def start_worker(method: str, config: Path, gpus: int, experiment: str = "") -> Warm:
    """Start a warm worker and wait until it has connected to every node."""
    argv = [PYTHON, "-m", "benchmarks.worker", method, str(config), str(gpus)]
    if experiment:
        argv.append(experiment)
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, bufsize=1
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise RuntimeError(f"worker {method} failed to start (exit {proc.returncode})")
    ready: dict[str, Any] = json.loads(line)
    if not ready.get("ready"):
        w = Warm(proc, ready)
        w.close()
        raise RuntimeError(f"worker {method} could not reach every node: {ready.get('note')}")
    return Warm(proc, ready)


@dataclass
class FleetBench:
    """One simulated fleet and every fleet-status method over it."""

    fleet: SimFleet
    work: Path
    warm: dict[str, Warm] = field(default_factory=dict)
    meter: ServerMeter | None = None

    @property
    def n(self) -> int:
        """Number of nodes."""
        return self.fleet.size

    def setup(self) -> None:
        """Write the baselines' inputs and migrate the audit database gpubot cold writes to."""
        f = self.fleet
        for node in f.nodes:
            if any(c.isspace() for c in node.nvidia_smi):
                raise RuntimeError(f"nvidia-smi path with spaces: {node.nvidia_smi!r}")
        (self.work / "nodes.txt").write_text(
            "".join(f"{n.port} {n.nvidia_smi}\n" for n in f.nodes), encoding="utf-8"
        )
        ssh = " ".join(
            shlex.quote(a)
            for a in (
                "ssh",
                "-n",
                "-i",
                str(f.client_key),
                "-o",
                f"UserKnownHostsFile={f.known_hosts}",
                *SSH_OPTS,
            )
        )
        remote = baseline_command("SMI").replace("SMI", "$smi")  # expanded here, sent unquoted
        target = shlex.quote(f"{f.user}@127.0.0.1")
        # What an admin writes: a loop over the nodes, one ssh each.
        (self.work / "seq.sh").write_text(
            "while read -r port smi; do\n"
            f'  {ssh} -p "$port" {target} "{remote}" || exit 1\n'
            f"done < {shlex.quote(str(self.work / 'nodes.txt'))}\n",
            encoding="utf-8",
        )
        one = f'port=$1 smi=$2; exec {ssh} -p "$port" {target} "{remote}"'
        (self.work / "one.sh").write_text(one + "\n", encoding="utf-8")
        spec = {
            "user": f.user,
            "key": str(f.client_key),
            "nodes": [{"port": n.port, "command": baseline_command(n.nvidia_smi)} for n in f.nodes],
        }
        (self.work / "pssh.json").write_text(json.dumps(spec), encoding="utf-8")
        spec["known_hosts"] = str(f.known_hosts)
        (self.work / "asyncssh.json").write_text(json.dumps(spec), encoding="utf-8")
        configs = load(f.config_path).nodes
        probe = {
            **spec,
            "nodes": [
                {"port": n.port, "command": remote_command(c, "probe")}
                for n, c in zip(f.nodes, configs, strict=True)
            ],
        }
        (self.work / "asyncssh_probe.json").write_text(json.dumps(probe), encoding="utf-8")
        del probe["known_hosts"]
        (self.work / "pssh_probe.json").write_text(json.dumps(probe), encoding="utf-8")
        (self.work / "asyncssh_cold.py").write_text(ASYNCSSH_COLD, encoding="utf-8")
        self._write_ansible()
        db = run_timed([PYTHON, "-m", "gpubot", "--config", str(f.config_path), "db", "upgrade"])
        if db.returncode != 0:
            raise RuntimeError(f"gpubot db upgrade failed: {db.stderr.strip()}")

    def _write_ansible(self) -> None:
        f = self.fleet
        common = (
            f"-o UserKnownHostsFile={f.known_hosts} -o StrictHostKeyChecking=yes "
            "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
        )
        lines = ["[sim]"]
        for n in f.nodes:
            lines.append(
                f"{n.name} ansible_host=127.0.0.1 ansible_port={n.port} ansible_user={f.user} "
                f"ansible_ssh_private_key_file={f.client_key} smi={n.nvidia_smi}"
            )
        lines += [
            "",
            "[sim:vars]",
            "ansible_connection=ssh",
            f"ansible_python_interpreter={f.python}",
            f"ansible_ssh_common_args='{common}'",
            "",
        ]
        (self.work / "inventory.ini").write_text("\n".join(lines), encoding="utf-8")
        home = self.work / "ansible-home"
        home.mkdir(exist_ok=True)
        (self.work / "ansible.cfg").write_text("[defaults]\n", encoding="utf-8")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOT_", "ANSIBLE_"))}
        home = str(self.work / "ansible-home")
        env.update(
            ANSIBLE_HOME=home,
            ANSIBLE_LOCAL_TEMP=f"{home}/tmp",
            ANSIBLE_REMOTE_TEMP=f"{home}/rtmp",
            ANSIBLE_PIPELINING="True",
            # Cold like every other cold method: no ControlMaster/ControlPersist (the default
            # keeps a master per host for 60 s), and so no ControlPath socket either.
            ANSIBLE_SSH_ARGS="-o ControlMaster=no",
            ANSIBLE_SSH_CONTROL_PATH_DIR=f"{home}/cp",
            ANSIBLE_PERSISTENT_CONTROL_PATH_DIR=f"{home}/pcp",
            ANSIBLE_HOST_KEY_CHECKING="True",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_CONFIG=str(self.work / "ansible.cfg"),
            ANSIBLE_LOAD_CALLBACK_PLUGINS="False",
            ANSIBLE_DEPRECATION_WARNINGS="False",
        )
        return env

    # ---- methods -------------------------------------------------------------------------

    def run(self, method: str) -> Sample:
        """Run ``method`` once over the whole fleet; return its sample (checked)."""
        meter = self.meter
        procs = meter.count() if meter else 0
        server0 = meter.usage() if meter else None
        sample = self._dispatch(method)
        if meter is not None and server0 is not None:
            meter.settle(procs)  # cold methods' sessions finish closing on the server
            sample.server_cpu = (meter.usage() or 0.0) - server0
        return sample

    def _dispatch(self, method: str) -> Sample:
        runners: dict[str, Callable[[], Sample]] = {
            "ssh-seq": lambda: self._cold(["bash", str(self.work / "seq.sh")], self._check_text),
            "ssh-xargs": lambda: self._cold(
                [
                    "xargs",
                    "-a",
                    str(self.work / "nodes.txt"),
                    "-P",
                    str(self.n),
                    "-n",
                    "2",
                    "sh",
                    str(self.work / "one.sh"),
                ],
                self._check_text,
            ),
            "pssh": lambda: self._cold(
                [PYTHON, "-m", "benchmarks.pssh_status", str(self.work / "pssh.json")],
                self._check_text,
            ),
            "asyncssh-cold": lambda: self._cold(
                [PYTHON, str(self.work / "asyncssh_cold.py"), str(self.work / "asyncssh.json")],
                self._check_text,
            ),
            "pssh:probe": lambda: self._cold(
                [PYTHON, "-m", "benchmarks.pssh_status", str(self.work / "pssh_probe.json")],
                self._check_text,
            ),
            "asyncssh-cold:probe": lambda: self._cold(
                [
                    PYTHON,
                    str(self.work / "asyncssh_cold.py"),
                    str(self.work / "asyncssh_probe.json"),
                ],
                self._check_text,
            ),
            "ansible": lambda: self._cold(
                [
                    _ansible_bin() or "ansible",
                    "sim",
                    "-i",
                    str(self.work / "inventory.ini"),
                    "-m",
                    "shell",
                    "-f",
                    str(self.n),
                    "-o",
                    "-a",
                    baseline_command("SMI").replace("SMI", "{{ smi }}"),
                ],
                self._check_ansible,
            ),
            "gpubot-cold": lambda: self._cold(
                [
                    PYTHON,
                    "-m",
                    "gpubot",
                    "--config",
                    str(self.fleet.config_path),
                    "status",
                    "all",
                    "--json",
                ],
                self._check_gpubot,
            ),
        }
        if method in runners:
            return runners[method]()
        spec = warm_spec(method)
        if spec is None:
            raise ValueError(f"unknown method {method!r}")
        return self._warm(*spec)

    def _cold(self, argv: list[str], check: Callable[[Finished], str | None]) -> Sample:
        fin = run_timed(argv, env=self._env(), timeout=600)
        why = check(fin)
        return Sample(fin.wall, fin.cpu, ok=why is None, note=why or "")

    def start_warm(self, kind: str, experiment: str) -> Warm:
        """Return the worker of ``kind`` (with ``experiment``), starting it if needed."""
        key = f"{kind}:{experiment}" if experiment else kind
        w = self.warm.get(key)
        if w is None:
            w = self.warm[key] = start_worker(
                kind, self.fleet.config_path, self.fleet.gpus, experiment
            )
        return w

    def _warm(self, kind: str, experiment: str, what: str) -> Sample:
        r = self.start_warm(kind, experiment).round(what)
        return Sample(r["wall"], r["cpu"], ok=r["ok"], note=r["note"])

    def close(self) -> None:
        """Stop the warm workers."""
        for w in self.warm.values():
            w.close()
        self.warm.clear()
        if self.meter is not None:
            self.meter.close()

    # ---- output checks -------------------------------------------------------------------

    def _check_text(self, fin: Finished) -> str | None:
        if fin.returncode != 0:
            return f"exit {fin.returncode}: {fin.stderr.strip()[-300:]}"
        want = self.n * self.fleet.gpus
        commas = len(GPU_FIELDS) - 1
        got = len(
            [ln for ln in fin.stdout.splitlines() if ln.count(",") == commas and "GPU-" in ln]
        )
        return None if got == want else f"expected {want} GPU lines, got {got}"

    def _check_ansible(self, fin: Finished) -> str | None:
        if fin.returncode != 0:
            return f"exit {fin.returncode}: {(fin.stdout + fin.stderr).strip()[-300:]}"
        # -o prints one line per host; its output's newlines appear as literal "\n".
        text = fin.stdout.replace("\\n", "\n")
        want = self.n * self.fleet.gpus
        got = len([ln for ln in text.splitlines() if "GPU-" in ln])
        return None if got >= want else f"expected {want} GPU lines, got {got}"

    def _check_gpubot(self, fin: Finished) -> str | None:
        if fin.returncode != 0:
            return f"exit {fin.returncode}: {fin.stderr.strip()[-300:]}"
        doc = json.loads(fin.stdout)
        nodes = doc["nodes"]
        bad = [n["name"] for n in nodes if not n["ok"] or len(n["gpus"]) != self.fleet.gpus]
        if len(nodes) != self.n or bad:
            return f"{len(nodes)} nodes, not ok: {bad[:5]}"
        return None


def check_one_node_output(text: str, gpus: int) -> str | None:
    """Return why one node's baseline output is incomplete (re-exported for the smoke test)."""
    return check_baseline_output(text, gpus)


def measure(
    fleet: SimFleet,
    work: Path,
    methods: list[str],
    repeat: int,
    slow_repeat: int,
    log: Callable[[str], None],
) -> tuple[dict[str, Series], dict[str, Any]]:
    """Run every method ``repeat`` times over ``fleet`` (alternating); return series and extras."""
    bench = FleetBench(fleet, work)
    bench.setup()
    bench.meter = ServerMeter(sshd_listeners())
    series = {m: Series(m, fleet.size, missing=installed(m)) for m in methods}
    extras: dict[str, Any] = {}
    runnable = [m for m in methods if not series[m].missing]
    try:
        for m in runnable:  # connect before any timing: warm rounds reuse the connections
            spec = warm_spec(m)
            if spec is not None:
                bench.start_warm(spec[0], spec[1])
        for r in range(repeat):
            order = runnable[r % len(runnable) :] + runnable[: r % len(runnable)]
            for m in order:
                if m in SLOW and r >= slow_repeat:
                    continue
                s = bench.run(m)
                series[m].samples.append(s)
                flag = "" if s.ok else f"  FAILED: {s.note}"
                log(
                    f"  N={fleet.size:<3} repeat {r + 1}/{repeat} {m:<15} {s.wall:7.3f} s  "
                    f"cpu {s.cpu:6.3f} s  server {s.server_cpu or 0:6.3f} s{flag}"
                )
        for kind, w in bench.warm.items():
            extras[kind] = {**w.ready, "after_rounds": w.last}
    finally:
        bench.close()
    return series, extras


# ---- start-up: what a cold ``gpubot status`` imports, and when ------------------------------

# Libraries ``gpubot status`` must not import (they slow its start), then the heavy ones it needs.
NOT_FOR_STATUS = (
    "alembic",
    "slack_bolt",
    "slack_sdk",
    "aiohttp",
    "apscheduler",
    "prometheus_client",
)
HEAVY = ("asyncssh", "cryptography", "sqlalchemy", "gpubot")
# Run in a new process: the imports of ``gpubot status`` in the order it needs them.
PHASES = """\
import json, time
t = [time.perf_counter()]
import gpubot.cli.status  # the command, its settings and the status service
t.append(time.perf_counter())
import gpubot.transport  # asyncssh: before the first connection goes out
t.append(time.perf_counter())
import gpubot.store  # SQLAlchemy: in a worker thread, while the nodes work
t.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""
PHASE_NAMES = (
    "`gpubot.cli.status` (settings, status service), before the probe",
    "`gpubot.transport` (asyncssh), before the probe",
    "`gpubot.store` (SQLAlchemy), in a worker thread while the nodes work",
)


def importtime_by_package(stderr: str) -> dict[str, float]:
    """Sum ``-X importtime``'s self times (ms) by top-level package."""
    out: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _cumulative, name = (x.strip() for x in line[12:].split("|"))
        if self_us.isdigit():
            top = name.split(".")[0]
            out[top] = out.get(top, 0.0) + int(self_us) / 1000
    return out


def _run_ok(argv: list[str], env: dict[str, str] | None) -> Finished:
    fin = run_timed(argv, env=env)
    if fin.returncode != 0:
        raise RuntimeError(f"{argv[1:4]} failed: {fin.stderr.strip()[-300:]}")
    return fin


def startup(config: Path, runs: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Measure a cold ``gpubot status all --json``'s imports: per phase (wall) and per package
    (``-X importtime``), each in a new process with nothing beside it; and which packages the
    real command on ``config`` loads (its own ``-X importtime``)."""
    interpreter, phases, packages, loaded = [], [], [], set()
    for _ in range(runs):
        interpreter.append(_run_ok([PYTHON, "-c", "pass"], env).wall)
        phases.append(json.loads(_run_ok([PYTHON, "-c", PHASES], env).stdout))
        fin = _run_ok([PYTHON, "-X", "importtime", "-c", PHASES], env)
        packages.append(importtime_by_package(fin.stderr))
        argv = [
            PYTHON,
            "-X",
            "importtime",
            "-m",
            "gpubot",
            "--config",
            str(config),
            "status",
            "all",
            "--json",
        ]
        loaded |= set(importtime_by_package(_run_ok(argv, env).stderr))
    names = sorted({p for run in packages for p in run})
    per_package = {p: statistics.median(run.get(p, 0.0) for run in packages) for p in names}
    return {
        "runs": runs,
        "interpreter_s": statistics.median(interpreter),
        "phases_s": {n: statistics.median(p[i] for p in phases) for i, n in enumerate(PHASE_NAMES)},
        "importtime_ms": per_package,
        "importtime_total_ms": statistics.median(sum(run.values()) for run in packages),
        "loaded": [p for p in (*HEAVY, *NOT_FOR_STATUS) if p in loaded],
        "forbidden_loaded": [p for p in NOT_FOR_STATUS if p in loaded],
    }


def startup_report(st: dict[str, Any]) -> list[str]:
    """Return the start-up section of the report."""
    phase_rows = [[n, f"{s * 1000:.0f}"] for n, s in st["phases_s"].items()]
    ms, loaded = st["importtime_ms"], st["loaded"]
    pkg_rows = [
        [f"`{p}`", "yes" if p in loaded else "no", f"{ms[p]:.0f}" if p in ms else "-"]
        for p in (*HEAVY, *NOT_FOR_STATUS)
    ]
    rest = st["importtime_total_ms"] - sum(ms.get(p, 0.0) for p in HEAVY)
    total = f"{st['importtime_total_ms']:.0f}"
    pkg_rows += [
        ["everything else (stdlib ...)", "yes", f"{rest:.0f}"],
        ["**all three imports above**", "", total],
    ]
    return [
        "### Start-up of a cold `gpubot status all --json`",
        "",
        f"Median of {st['runs']} runs. An empty interpreter (`python -c pass`) starts in "
        f"{st['interpreter_s'] * 1000:.0f} ms. Imports, in a new process each, in the order "
        "status needs them (wall ms):",
        "",
        table(["import", "ms"], phase_rows),
        "",
        "By package: *loaded* by the real `gpubot status all --json` on this fleet (its "
        "`-X importtime`); *import ms*: the self times of `-X importtime` summed, for the three "
        "imports above alone (importtime's own overhead included):",
        "",
        table(["package", "loaded", "import ms"], pkg_rows),
        "",
    ]
