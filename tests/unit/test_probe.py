"""The one-exec node probe, run by real dash and bash against real processes holding files.

A stand-in nvidia-smi (a tiny sh script reading its answers from files) lets each test choose what
the GPUs say; the "device files" are plain files in a temporary folder that real ``sleep``
processes keep open, so ``fuser -v`` and ``/proc`` answer for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpubot.core.models import CommandResult, ComputeApp, DeviceHolder, GpuInfo, NodeConfig
from gpubot.core.probe import (
    PROBE_SCRIPT,
    fuser_argv,
    new_nonce,
    parse_fuser,
    parse_probe,
    parse_procs,
    probe_argv,
    proc_argv,
)
from gpubot.errors import ConfigError, ParseError, ProbeError, SmiFailed, SmiMissing

U = [f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(3)]
SLEEP_PY = [sys.executable, "-c", "import time; time.sleep(120)"]
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]

SMI = """#!/bin/sh
d=$(dirname "$0")
printf '%s\\n' "$*" >>"$d/calls"
mode=$(cat "$d/mode" 2>/dev/null)
case $mode in
  hang) exec sleep 30 ;;
  stubborn) trap '' TERM; while :; do sleep 0.05; done ;;
  driver) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
          exit 9 ;;
  apps-fail) case $1 in --query-compute-apps*) echo "Unknown Error" >&2; exit 255 ;; esac ;;
esac
case $1 in
  --query-gpu*) cat "$d/gpus" ;;
  --query-compute-apps*) cat "$d/apps" ;;
esac
"""


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class Box:
    dir: Path
    node: NodeConfig
    pids: dict[str, int]
    gone: int

    def set(self, *, gpus: str | None = None, apps: str | None = None, mode: str = "") -> None:
        if gpus is not None:
            (self.dir / "gpus").write_text(gpus)
        if apps is not None:
            (self.dir / "apps").write_text(apps)
        (self.dir / "mode").write_text(mode)
        (self.dir / "calls").write_text("")

    def calls(self) -> list[str]:
        return (self.dir / "calls").read_text().splitlines()


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    d = tmp_path_factory.mktemp("probe")
    dev = d / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    smi = d / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    weird = d / "x) (y\nz"  # comm with a space, parens and a newline
    shutil.copy("/bin/sleep", weird)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    opened = []

    def hold(key: str, files: list[str], argv: list[str] | None = None) -> None:
        fds = [os.open(dev / f, os.O_RDONLY) for f in files]
        opened.extend(fds)
        procs[key] = subprocess.Popen(argv or ["sleep", "120"], pass_fds=fds)

    try:
        # A: listed on GPU 0 and holds nvidia0 + ctl (a normal CUDA job).
        hold(
            "A",
            ["nvidia0", "nvidiactl"],
            [*SLEEP_PY, "\nffffffffffffffffffffffffffffffff end\n"],
        )
        hold("B", ["nvidia1"])  # hidden: holds GPU 1, nvidia-smi does not list it
        hold("C", ["nvidiactl", "nvidia-uvm"])  # ctl-only
        hold("D", ["nvidia2", "nvidia-uvm"], [str(weird), "120"])  # hidden on GPU 2, odd comm
        gone = subprocess.Popen(["true"])
        gone.wait()
        for fd in opened:
            os.close(fd)
        node = NodeConfig(
            name="n1",
            host="unused",
            dev_prefix=f"{dev}/nvidia",
            nvidia_smi=str(smi),
        )
        b = Box(d, node, {k: p.pid for k, p in procs.items()}, gone.pid)
        time.sleep(0.05)
        yield b
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def gpus_text(n: int = 3) -> str:
    return "".join(f"{i}, {U[i]}, NVIDIA H200, {1024 * i}, 143771, {10 * i}\n" for i in range(n))


def run(argv: list[str], shell: str = "dash", env: dict[str, str] | None = None) -> CommandResult:
    assert argv[0] == "sh"
    p = subprocess.run(
        [shutil.which(shell) or shell, *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    return CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr)


def probe(box: Box, shell: str = "dash", node: NodeConfig | None = None, **kw: object):  # type: ignore[no-untyped-def]
    node = node or box.node
    nonce = new_nonce()
    kw.setdefault("smi_timeout_s", 5)
    nvml = kw.pop("nvml", None)
    env = kw.pop("env", None)
    argv = probe_argv(node, nonce, **kw)  # type: ignore[arg-type]
    return parse_probe(node, nonce, run(argv, shell, env), 1000.0, nvml=nvml)  # type: ignore[arg-type]


# ---- argv -----------------------------------------------------------------------------------


def test_script_is_constant_and_values_are_arguments() -> None:
    nasty = NodeConfig(
        name="n2",
        host="h",
        dev_prefix="/dev/x'; rm -rf / #$(reboot)/nvidia",
        nvidia_smi="/opt/nv smi/$(id)`x`;|&",
        sudo=True,
    )
    plain = NodeConfig(name="n1", host="h")
    a = probe_argv(nasty, "a" * 32, smi_timeout_s=2.5, gpu_indices=[0, 3])
    b = probe_argv(plain, "b" * 32, smi_timeout_s=10)
    assert a[:4] == b[:4] == ["sh", "-c", PROBE_SCRIPT, "gpubot-probe"]
    assert a[4:] == ["a" * 32, nasty.nvidia_smi, nasty.dev_prefix, "2.5", "sudo", "smi", "0,3"]
    assert b[4:] == ["b" * 32, "nvidia-smi", "/dev/nvidia", "10", "-", "smi", ""]
    assert "nvidia" not in PROBE_SCRIPT.replace("nvidia-smi", "").replace("--query", "")
    assert "*" not in PROBE_SCRIPT.split("fuser -v")[1].split("\n")[0]  # never a glob
    assert probe_argv(plain, "c" * 32, smi_timeout_s=1, gpu_indices=[1], skip_smi=True,
                      pids=[7, 9])[9:] == ["nvml", "1", "7", "9"]  # fmt: skip


@pytest.mark.parametrize(
    "kw",
    [
        {"smi_timeout_s": 0},
        {"smi_timeout_s": 1, "skip_smi": True},
        {"smi_timeout_s": 1, "gpu_indices": [-1]},
        {"smi_timeout_s": 1, "pids": [True]},
    ],
)
def test_probe_argv_rejects(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        probe_argv(NodeConfig(name="n", host="h"), "a" * 32, **kw)  # type: ignore[arg-type]


def test_probe_argv_rejects_bad_nonce_and_relative_prefix() -> None:
    with pytest.raises(ValueError):
        probe_argv(NodeConfig(name="n", host="h"), "not hex!", smi_timeout_s=1)
    with pytest.raises(ConfigError):
        probe_argv(NodeConfig(name="n", host="h", dev_prefix="dev/nvidia"), "a" * 32,
                   smi_timeout_s=1)  # fmt: skip


# ---- end to end against real processes --------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_probe_builds_the_snapshot(box: Box, shell: str) -> None:
    a, b, c, d = (box.pids[k] for k in "ABCD")
    box.set(
        gpus=gpus_text(),
        apps=f"{a}, {U[0]}, 2048, /usr/bin/python3\n{box.gone}, {U[1]}, 512, /usr/bin/ghost\n",
    )
    snap = probe(box, shell)
    assert snap.node == "n1" and snap.taken_at == 1000.0
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    assert snap.gpu(1) == GpuInfo(1, U[1], "NVIDIA H200", 1024, 143771, 10)
    got = {(p.pid, p.gpu_index): p for p in snap.processes}
    assert set(got) == {(a, 0), (box.gone, 1), (b, 1), (d, 2)}

    pa = got[(a, 0)]
    assert (pa.visible_to_nvidia_smi, pa.holds_device_file, pa.used_memory_mib) == (
        True,
        True,
        2048,
    )
    assert pa.process_name == "/usr/bin/python3" and not pa.hidden and pa.exists
    assert pa.start_ticks == start_ticks(a) and pa.ppid == os.getpid() and pa.user == "root"
    assert pa.state == "S" and pa.elapsed_s is not None and 0 <= pa.elapsed_s < 120
    # A forged section line in argv is just text of the command:
    assert pa.command == " ".join(SLEEP_PY) + "  ffffffffffffffffffffffffffffffff end"
    assert pa.wchan is not None and pa.cgroup is not None

    ghost = got[(box.gone, 1)]  # listed by nvidia-smi, gone from /proc
    assert ghost.visible_to_nvidia_smi and not ghost.holds_device_file
    assert ghost.start_ticks is None and not ghost.exists and ghost.used_memory_mib == 512

    pb = got[(b, 1)]
    assert pb.hidden and pb.used_memory_mib is None and pb.process_name == "sleep"
    assert pb.start_ticks == start_ticks(b)

    pd = got[(d, 2)]
    assert pd.hidden and pd.process_name == "x) (y\nz" and pd.start_ticks == start_ticks(d)

    assert [p.pid for p in snap.ctl_only] == [c]  # D also holds uvm but is on GPU 2
    assert snap.ctl_only[0].start_ticks == start_ticks(c)
    assert [len(box.calls()), all("-i" not in c for c in box.calls())] == [2, True]


def test_a_listed_job_holding_other_gpus_files_stays_on_its_gpu(box: Box) -> None:
    # CUDA opens every visible GPU's device file: listed on GPU 0, it also holds nvidia2.
    fds = [os.open(f"{box.node.dev_prefix}{i}", os.O_RDONLY) for i in (0, 2)]
    job = subprocess.Popen(SLEEP_PY, pass_fds=fds)
    for fd in fds:
        os.close(fd)
    try:
        time.sleep(0.05)
        box.set(gpus=gpus_text(), apps=f"{job.pid}, {U[0]}, 100, /usr/bin/python3\n")
        snap = probe(box)
        mine = [(p.gpu_index, p.visible_to_nvidia_smi, p.holds_device_file)
                for p in snap.processes if p.pid == job.pid]  # fmt: skip
        assert mine == [(0, True, True)]
        assert (box.pids["D"], 2) in {(p.pid, p.gpu_index) for p in snap.processes}
    finally:
        job.kill()
        job.wait()


def test_probe_asks_only_the_given_gpus(box: Box) -> None:
    box.set(gpus="0, {0}, NVIDIA H200, 1, 2, 3\n2, {2}, NVIDIA H200, 1, 2, 3\n".format(*U),
            apps=f"{box.pids['B']}, {U[1]}, 99, /x\n")  # fmt: skip
    snap = probe(box, gpu_indices=[0, 2])
    assert any(c.endswith("-i 0,2") for c in box.calls())
    # GPU 1 was not asked for: its app and B's hold on nvidia1 are not in this snapshot.
    assert {(p.pid, p.gpu_index) for p in snap.processes} == {
        (box.pids["A"], 0),
        (box.pids["D"], 2),
    }


def test_app_on_an_unlisted_gpu_is_a_parse_error(box: Box) -> None:
    box.set(gpus=gpus_text(1), apps=f"{box.pids['A']}, {U[2]}, 99, /x\n")
    with pytest.raises(ParseError):
        probe(box)


def test_nvml_mode_skips_nvidia_smi(box: Box) -> None:
    box.set(mode="hang")  # would cost 5 s if it ran
    gpus = (GpuInfo(0, U[0], "NVIDIA H200", 1, 143771, 0), GpuInfo(1, U[1], "NVIDIA H200", 2, 3, 4))
    apps = (ComputeApp(box.pids["A"], U[0], 77, "/usr/bin/sleep"),)
    snap = probe(box, gpu_indices=[0, 1], skip_smi=True, pids=[box.pids["A"]], nvml=(gpus, apps))
    assert box.calls() == []
    assert snap.gpus == gpus
    got = {(p.pid, p.gpu_index): p for p in snap.processes}
    assert set(got) == {(box.pids["A"], 0), (box.pids["B"], 1)}
    assert got[(box.pids["A"], 0)].start_ticks == start_ticks(box.pids["A"])
    assert got[(box.pids["A"], 0)].used_memory_mib == 77


@pytest.mark.parametrize(
    ("mode", "error", "message"),
    [
        ("hang", SmiFailed, "nvidia-smi hung: no answer in 0.3s"),
        ("stubborn", SmiFailed, "nvidia-smi hung"),  # ignores TERM: KILLed a second later
        ("driver", SmiFailed, "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because"),
        ("apps-fail", SmiFailed, "nvidia-smi failed (exit 255): Unknown Error"),
    ],
)
def test_nvidia_smi_faults(box: Box, mode: str, error: type, message: str) -> None:
    box.set(gpus=gpus_text(), apps="", mode=mode)
    t = time.monotonic()
    with pytest.raises(error) as ei:
        probe(box, smi_timeout_s=0.3)
    assert ei.value.node == "n1" and ei.value.reason.startswith(message)
    assert time.monotonic() - t < 5


def test_nvidia_smi_missing(box: Box) -> None:
    with pytest.raises(SmiMissing):
        probe(box, node=replace(box.node, nvidia_smi=str(box.dir / "absent" / "nvidia-smi")))
    with pytest.raises(SmiMissing):
        probe(box, node=replace(box.node, nvidia_smi="no-such-nvidia-smi"))


def test_garbled_nvidia_smi_output(box: Box) -> None:
    box.set(gpus=gpus_text() + "1949090, 0 MiB\n", apps="")
    with pytest.raises(ParseError) as ei:
        probe(box)
    assert ei.value.line == "1949090, 0 MiB"


def _fake_sudo(tmp: Path, body: str) -> dict[str, str]:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    sudo = bindir / "sudo"
    sudo.write_text("#!/bin/sh\n" + body)
    sudo.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def test_sudo_runs_fuser_through_sudo_n(box: Box, tmp_path: Path) -> None:
    env = _fake_sudo(tmp_path, f'[ "$1" = -n ] || exit 99\necho "$*" >{tmp_path}/sudo.log\n'
                               'shift\nexec "$@"\n')  # fmt: skip
    box.set(gpus=gpus_text(), apps="")
    snap = probe(box, node=replace(box.node, sudo=True), env=env)
    assert (tmp_path / "sudo.log").read_text().startswith("-n fuser -v ")
    assert {p.pid for p in snap.processes} == {box.pids[k] for k in "ABD"}


def test_sudo_refusal_is_a_probe_error(box: Box, tmp_path: Path) -> None:
    env = _fake_sudo(tmp_path, 'echo "sudo: a password is required" >&2\nexit 1\n')
    box.set(gpus=gpus_text(), apps="")
    with pytest.raises(ProbeError, match="sudo -n fuser refused: sudo: a password is required"):
        probe(box, node=replace(box.node, sudo=True), env=env)


def test_missing_tools_are_named(box: Box, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"  # every tool the probe needs, except fuser and sudo
    bindir.mkdir()
    for tool in ("cat", "stat", "tr", "awk", "getconf", "timeout", "dirname", "sleep"):
        (bindir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {"PATH": str(bindir)}
    box.set(gpus=gpus_text(), apps="")
    with pytest.raises(ProbeError, match=r"fuser \(psmisc\) not found"):
        probe(box, env=env)
    with pytest.raises(ProbeError, match="sudo not found"):
        probe(box, node=replace(box.node, sudo=True), env=env)
    (bindir / "timeout").unlink()
    (bindir / "fuser").symlink_to(shutil.which("fuser") or "/usr/bin/fuser")
    with pytest.raises(ProbeError, match=r"timeout \(coreutils\) not found"):
        probe(box, env=env)


# ---- parse_probe on synthetic output -----------------------------------------------------------

N = "0123456789abcdef0123456789abcdef"
NODE = NodeConfig(name="n9", host="h", dev_prefix="/d/nvidia")


def out(*sections: str) -> CommandResult:
    return CommandResult(("sh",), 0, "".join(f"\n{N} {s}" for s in sections), "")


def test_parse_probe_minimal() -> None:
    r = out("probe 5 -\n", "gpus 0\n" + gpus_text(1), "apps 0\n", "fuser 1\n", "clock 100 5.0\n",
            "end\n")  # fmt: skip
    snap = parse_probe(NODE, N, r, 1.0)
    assert len(snap.gpus) == 1 and snap.processes == () and snap.ctl_only == ()


@pytest.mark.parametrize(
    ("result", "error", "match"),
    [
        (out("probe 5 -\n", "gpus 0\n" + gpus_text(1)), ParseError, "cut short"),
        (CommandResult(("sh",), 2, "", "sh: 0: cannot open x"), ProbeError, "probe failed"),
        (CommandResult(("sh",), 0, "hello\n", ""), ParseError, "no section marker"),
        (out("probe 5 -\n", "fatal no-timeout\n", "end\n"), ProbeError, "timeout"),
        (
            out(
                "probe 5 -\n", "gpus 0\n", "apps 0\n", "fuser 127\nsh: fuser: not found\n", "end\n"
            ),
            ProbeError,
            "fuser \\(psmisc\\) not found",
        ),
        (
            out(
                "probe 5 -\n",
                "gpus 0\n",
                "apps 0\n",
                "fuser 0\n/etc/passwd: root 1 f.... x\n",
                "end\n",
            ),
            ParseError,
            "did not ask",
        ),
        (out("probe 5 -\n", "gpus x\n", "end\n"), ParseError, "status"),
    ],
)
def test_parse_probe_errors(result: CommandResult, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        parse_probe(NODE, N, result, 1.0)


def test_forged_sections_with_another_nonce_are_text() -> None:
    other = "f" * 32
    r = out("probe 5 -\n", "gpus 0\n" + gpus_text(1) + f"\n{other} end\n", "apps 0\n", "end\n")
    with pytest.raises(ParseError):  # the forged line is just a garbled nvidia-smi line
        parse_probe(NODE, N, r, 1.0)


def test_vanished_midway_and_odd_stat() -> None:
    stat = "42 (a) b\n(c)) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n"
    r = out("procs\n", "clock 100 17.5\n", f"stat 42\n{stat}", "cmdline 42\n", "wchan 42\n0",
            "cgroup 42\n0::/job\n", "stat 43\n43 (x) S 1 2 3\n",
            "owners\n/proc/42 UNKNOWN 1234\n/proc/43 root 0\n", "end\n")  # fmt: skip
    with pytest.raises(ParseError):  # 43's stat is too short to be real
        parse_procs(r.stdout)
    r = out("procs\n", "clock 100 17.5\n", f"stat 42\n{stat}", "cmdline 42\n", "wchan 42\n0",
            "cgroup 42\n0::/job\n",
            "stat 44\n44 (y) S 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5 0\n",  # gone before stat(1)
            "owners\n/proc/42 UNKNOWN 1234\n", "end\n")  # fmt: skip
    procs = parse_procs(r.stdout)
    assert set(procs) == {42}
    p = procs[42]
    assert (p.ppid, p.state, p.start_ticks, p.user, p.elapsed_s) == (1, "S", 777, "1234", 9)
    assert (p.command, p.wchan, p.cgroup) == ("[a) b\n(c)]", None, "0::/job")
    with pytest.raises(ParseError):
        parse_procs(out("procs\n", "owners\nroot 0\n", "end\n").stdout)


# ---- fuser ------------------------------------------------------------------------------------

FUSER = """\
                     USER        PID ACCESS COMMAND
/tmp/a/very/long/path/of/the/node/dev/nvidia0:
                     root       8282 f.... sleep
                     alice      8283 F...m my job
Cannot stat file /proc/1/fd/7: Permission denied
/d/nvidiactl:        root       8283 f.... python3
/d/nvidia-uvm:       root     kernel mount /d/nvidia-uvm
"""


def test_parse_fuser_table() -> None:
    assert parse_fuser(FUSER) == (
        DeviceHolder(
            "/tmp/a/very/long/path/of/the/node/dev/nvidia0", 8282, "root", "f....", "sleep"
        ),
        DeviceHolder(
            "/tmp/a/very/long/path/of/the/node/dev/nvidia0", 8283, "alice", "F...m", "my job"
        ),
        DeviceHolder("/d/nvidiactl", 8283, "root", "f....", "python3"),
    )
    assert parse_fuser("") == ()


@pytest.mark.parametrize(
    "bad",
    [
        "                     root       8282 f.... sleep",  # no file before it
        "/d/nvidia0:          root       x f.... sleep",
        "/d/nvidia0:          root       12 zz sleep",
        "/d/nvidia0:          root       12",
        "sudo: a password is required",
    ],
)
def test_parse_fuser_rejects(bad: str) -> None:
    with pytest.raises(ParseError) as ei:
        parse_fuser(bad + "\n")
    assert ei.value.line == bad


def test_fuser_argv_runs_for_real(box: Box) -> None:
    dev = box.node.dev_prefix
    argv = fuser_argv([f"{dev}0", f"{dev}ctl"], sudo=False)
    assert argv[-3:] == ["-v", f"{dev}0", f"{dev}ctl"] and "fuser" in argv
    assert fuser_argv(["/d/x"], sudo=True)[4:8] == ["sudo", "-n", "fuser", "-v"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    held = {(h.path, h.pid) for h in parse_fuser(r.stdout)}
    assert held == {(f"{dev}0", box.pids["A"]), (f"{dev}ctl", box.pids["A"]),
                    (f"{dev}ctl", box.pids["C"])}  # fmt: skip
    with pytest.raises(ValueError):
        fuser_argv(["-k"], sudo=False)
    with pytest.raises(ValueError):
        fuser_argv([], sudo=False)


def test_proc_argv_runs_for_real(box: Box) -> None:
    a, d = box.pids["A"], box.pids["D"]
    argv = proc_argv([a, d, box.gone, a], sudo=False)
    assert proc_argv([1], sudo=True)[:3] == ["sudo", "-n", "sh"]
    procs = parse_procs(run(argv).stdout)
    assert set(procs) == {a, d}
    assert procs[d].start_ticks == start_ticks(d) and procs[d].command.endswith(" 120")
    assert procs[a].ppid == os.getpid()
