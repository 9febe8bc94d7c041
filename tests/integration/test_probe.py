"""The one-exec node probe, run by real bash against real processes holding files.

A stand-in nvidia-smi (a tiny sh script reading its answers from files) lets each test choose what
the GPUs say; the "device files" are plain files in a temporary folder that real ``sleep``
processes keep open, so ``fuser -v`` and ``/proc`` answer for real.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.core.flags import gpu_flags
from gpubot.core.models import CommandResult, ComputeApp, DeviceHolder, GpuInfo, NodeConfig
from gpubot.core.probe import script as probe_script
from gpubot.core.probe.fields import parse_fuser, printable
from gpubot.core.probe.holders import Holders
from gpubot.core.probe.nvsmi import gpu_query_argv
from gpubot.core.probe.script import PROBE_SCRIPT
from gpubot.core.probe.snapshot import NvmlKnown, parse_probe, parse_procs, probe_argv, proc_argv
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.errors import ConfigError, ParseError, ProbeError, ResetRefused, SmiFailed, SmiMissing
from tests.fixtures.probe_box import BUS, SLEEP_PY, SMI, U, gpus_text, run, set_minors
from tests.procs import start_ticks


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
    set_minors(d / "driver", [0, 1, 2])
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
            [*SLEEP_PY, "\n@gpubot end\n"],
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
            driver_dir=str(d / "driver"),
        )
        b = Box(d, node, {k: p.pid for k, p in procs.items()}, gone.pid)
        time.sleep(0.05)
        yield b
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def probe(box: Box, node: NodeConfig | None = None, **kw: object):  # type: ignore[no-untyped-def]
    node = node or box.node
    kw.setdefault("smi_timeout_s", 5)
    kw.setdefault("budget_s", 60)  # a loaded 2-core box must not turn slowness into "unknown"
    nvml = kw.pop("nvml", None)
    env = kw.pop("env", None)
    argv = probe_argv(node, nvml=kw.pop("nvml_known", None), **kw)  # type: ignore[arg-type]
    return parse_probe(node, run(argv, env), 1000.0, nvml=nvml)  # type: ignore[arg-type]


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
    a = probe_argv(nasty, smi_timeout_s=2.5, gpu_indices=[0, 3])
    b = probe_argv(plain, smi_timeout_s=10)
    assert a[:4] == b[:4] == ["bash", "-c", PROBE_SCRIPT, "gpubot-probe"]
    drv = "/proc/driver/nvidia"
    assert a[4:] == [
        nasty.nvidia_smi,
        nasty.dev_prefix,
        "2.5",
        "sudo",
        "smi",
        "0,3",
        drv,
        "",
        "6000",
        "always",
        "-",
    ]
    plain_args = ["nvidia-smi", "/dev/nvidia", "10", "-", "smi", "", drv, "", "21000"]
    assert b[4:] == [*plain_args, "always", "-"]
    # No per-call secret: anyone on the node may read this argv; two calls are identical.
    assert probe_argv(plain, smi_timeout_s=10) == b
    assert "nvidia" not in PROBE_SCRIPT.replace("nvidia-smi", "").replace("--query", "")
    assert "*" not in PROBE_SCRIPT.split("fuser -v")[1].split("\n")[0]  # never a glob
    assert (
        probe_argv(
            plain,
            smi_timeout_s=1,
            nvml=NvmlKnown([1], pids=[7, 9], minors=[4]),
            budget_s=2.5,
            holders=Holders.IF_UNEXPLAINED,  # the script has no tables from NVML: always
            state_dir="/run/x",
        )[8:]
        == ["nvml", "1", drv, "4", "2500", "always", "/run/x", "7", "9"]
    )
    assert "process_name" not in PROBE_SCRIPT  # a process's own say about its name


@pytest.mark.parametrize(
    "kw",
    [
        {"smi_timeout_s": 0},
        {"smi_timeout_s": 1, "gpu_indices": [-1]},
        {"smi_timeout_s": 1, "nvml": NvmlKnown([0], pids=[True])},
    ],
)
def test_probe_argv_rejects(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        probe_argv(NodeConfig(name="n", host="h"), **kw)  # type: ignore[arg-type]


def test_probe_argv_rejects_a_relative_prefix() -> None:
    with pytest.raises(ConfigError):
        probe_argv(NodeConfig(name="n", host="h", dev_prefix="dev/nvidia"), smi_timeout_s=1)


# ---- end to end against real processes --------------------------------------------------------


def test_probe_builds_the_snapshot(box: Box) -> None:
    a, b, c, d = (box.pids[k] for k in "ABCD")
    box.set(
        gpus=gpus_text(),
        apps=f"{a}, {U[0]}, 2048\n{box.gone}, {U[1]}, 512\n",
    )
    snap = probe(box)
    assert snap.node == "n1" and snap.taken_at == 1000.0
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    assert snap.gpu(1) == GpuInfo(1, U[1], "NVIDIA H200", 1024, 143771, 10, BUS[1], 1)
    got = {(p.pid, p.gpu_index): p for p in snap.processes}
    assert set(got) == {(a, 0), (box.gone, 1), (b, 1), (d, 2)}

    pa = got[(a, 0)]
    assert (pa.visible_to_nvidia_smi, pa.holds_device_file, pa.used_memory_mib) == (
        True,
        True,
        2048,
    )
    assert pa.process_name == Path(sys.executable).name[:15] and not pa.hidden and pa.exists
    assert pa.start_ticks == start_ticks(a) and pa.ppid == os.getpid() and pa.user == "root"
    assert (pa.uid, pa.real_uid, pa.argv0) == (0, 0, sys.executable)
    assert pa.exe == os.path.realpath(sys.executable)
    assert pa.state == "S" and pa.elapsed_s is not None and 0 <= pa.elapsed_s < 120
    # A forged section line in argv is just text of the command, its newlines shown escaped:
    assert pa.command == " ".join(SLEEP_PY) + " \\x0a@gpubot end\\x0a"
    assert pa.wchan is not None and pa.cgroup is not None

    ghost = got[(box.gone, 1)]  # listed by nvidia-smi, gone from /proc
    assert ghost.visible_to_nvidia_smi and not ghost.holds_device_file
    assert ghost.start_ticks is None and not ghost.exists and ghost.used_memory_mib == 512

    pb = got[(b, 1)]
    assert pb.hidden and pb.used_memory_mib is None and pb.process_name == "sleep"
    assert pb.start_ticks == start_ticks(b)

    pd = got[(d, 2)]
    assert pd.hidden and pd.process_name == "x) (y\\x0az" and pd.start_ticks == start_ticks(d)
    assert pd.exe == str(box.dir / "x) (y\nz")  # read as bytes, not split on the newline

    assert [p.pid for p in snap.ctl_only] == [c]  # D also holds uvm but is on GPU 2
    assert snap.ctl_only[0].user == "root"  # fuser's row: a control file's holder is never read
    assert [len(box.calls()), all("-i" not in c for c in box.calls())] == [2, True]


def test_a_listed_job_holding_other_gpus_files_stays_on_its_gpu(box: Box) -> None:
    # CUDA opens every visible GPU's device file: listed on GPU 0, it also holds nvidia2.
    fds = [os.open(f"{box.node.dev_prefix}{i}", os.O_RDONLY) for i in (0, 2)]
    job = subprocess.Popen(SLEEP_PY, pass_fds=fds)
    for fd in fds:
        os.close(fd)
    try:
        time.sleep(0.05)
        box.set(gpus=gpus_text(), apps=f"{job.pid}, {U[0]}, 100\n")
        snap = probe(box)
        mine = [
            (p.gpu_index, p.visible_to_nvidia_smi, p.holds_device_file)
            for p in snap.processes
            if p.pid == job.pid
        ]
        assert mine == [(0, True, True)]
        assert (box.pids["D"], 2) in {(p.pid, p.gpu_index) for p in snap.processes}
    finally:
        job.kill()
        job.wait()


def test_probe_asks_only_the_given_gpus(box: Box) -> None:
    box.set(
        gpus="".join(ln for ln in gpus_text().splitlines(keepends=True) if ln[0] in "02"),
        apps=f"{box.pids['B']}, {U[1]}, 99\n",
    )
    snap = probe(box, gpu_indices=[0, 2])
    assert any(c.endswith("-i 0,2") for c in box.calls())
    # GPU 1 was not asked for: its app and B's hold on nvidia1 are not in this snapshot.
    assert {(p.pid, p.gpu_index) for p in snap.processes} == {
        (box.pids["A"], 0),
        (box.pids["D"], 2),
    }


def test_app_on_an_unlisted_gpu_is_a_parse_error(box: Box) -> None:
    box.set(gpus=gpus_text(1), apps=f"{box.pids['A']}, {U[2]}, 99\n")
    with pytest.raises(ParseError):
        probe(box)


def test_nvml_mode_skips_nvidia_smi(box: Box) -> None:
    box.set(mode="hang")  # would cost 5 s if it ran
    # NVML knows GPU 0's minor; GPU 1's comes from the driver's file for its bus id.
    gpus = (
        GpuInfo(0, U[0], "NVIDIA H200", 1, 143771, 0, None, 0),
        GpuInfo(1, U[1], "NVIDIA H200", 2, 3, 4, BUS[1], None),
    )
    apps = (ComputeApp(box.pids["A"], U[0], 77),)
    known = NvmlKnown([0, 1], pids=[box.pids["A"]], minors=[0])
    snap = probe(box, nvml_known=known, nvml=(gpus, apps))
    assert box.calls() == []
    assert snap.gpus == (gpus[0], replace(gpus[1], minor=1))
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
def test_nvidia_smi_faults(box: Box, mode: str, error: type[SmiFailed], message: str) -> None:
    box.set(gpus=gpus_text(), apps="", mode=mode)
    t = time.monotonic()
    with pytest.raises(error) as ei:
        probe(box, smi_timeout_s=0.3)
    assert ei.value.node == "n1" and ei.value.reason.startswith(message)
    assert time.monotonic() - t < 5


def test_a_query_out_of_time_is_signalled_only_while_it_is_the_same_process() -> None:
    # The probe signals a query by the PID it wrote, and only if that PID still started when the
    # query did: a PID the kernel gave to another process since is never signalled.
    script = (
        probe_script._COMMON
        + probe_script._QUERY
        + """
sleep 30 & p=$!
signal KILL "$p" 12345   # another start time: someone else's process now
kill -0 "$p" && echo spared
started "$p"; signal KILL "$p" "$R"
wait "$p"; echo "status $?"
"""
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout.split("\n")[:2] == ["spared", "status 137"], out.stderr


def test_another_users_nvidia_smi_never_stops_the_probe(box: Box) -> None:
    # Anyone may start a process named nvidia-smi whose argv holds gpubot's nvidia-smi path, and
    # let it age past the probe's limit; gpubot's own account may run nvidia-smi for other things.
    # Only one of the probe's own queries (all uids the probe's, the query's exact argv) is stuck.
    folder = Path(tempfile.mkdtemp(prefix="gpubot-fake-smi-"))
    folder.chmod(0o755)
    fake = folder / "nvidia-smi"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    fake.chmod(0o755)
    argv = [box.node.nvidia_smi, "60"]
    procs = [
        subprocess.Popen(argv, executable=fake, user="nobody"),
        subprocess.Popen(argv, executable=fake),
    ]
    try:
        time.sleep(2.5)  # older than the limit of a 0.3 s query: 2 × 0 + 2 s
        box.set(gpus=gpus_text(), apps="")
        # No records folder: the check walks /proc (test_probe_records: the queries' records).
        assert len(probe(box, smi_timeout_s=0.3, state_dir="").gpus) == 3
        box.set(gpus=gpus_text(), apps="", mode="stubborn")  # a query of ours that never ends
        ours = subprocess.Popen(gpu_query_argv(box.node.nvidia_smi), start_new_session=True)
        procs.append(ours)
        time.sleep(2.5)
        with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {ours.pid} stuck"):
            probe(box, smi_timeout_s=0.3, state_dir="")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder)
        box.set()


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
    env = _fake_sudo(
        tmp_path, f'[ "$1" = -n ] || exit 99\necho "$*" >{tmp_path}/sudo.log\nshift\nexec "$@"\n'
    )
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
    bindir = tmp_path / "bin"  # what the stand-in nvidia-smi needs; none of fuser and sudo
    bindir.mkdir()
    for tool in ("cat", "dirname", "sleep"):
        (bindir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {"PATH": str(bindir)}
    box.set(gpus=gpus_text(), apps="")
    with pytest.raises(ProbeError, match=r"fuser \(psmisc\) not found"):
        probe(box, env=env)
    with pytest.raises(ProbeError, match="sudo not found"):
        probe(box, node=replace(box.node, sudo=True), env=env)
    # Nothing else: no timeout, awk, getconf, pgrep or getent is needed.
    (bindir / "fuser").symlink_to(shutil.which("fuser") or "/usr/bin/fuser")
    assert len(probe(box, env=env).gpus) == 3


def test_an_old_bash_or_none_is_named() -> None:
    old = out("probe 5 -\n", "fatal old-bash\n", "end\n")
    with pytest.raises(ProbeError, match=r"needs bash 4\.4 or later"):
        parse_probe(NODE, old, 1.0)
    none = CommandResult(("bash",), 127, "", "sh: 1: bash: not found\n")
    with pytest.raises(ProbeError, match="bash not found on the node"):
        parse_probe(NODE, none, 1.0)


# ---- parse_probe on synthetic output -----------------------------------------------------------

NODE = NodeConfig(name="n9", host="h", dev_prefix="/d/nvidia")
P42 = "p 42 S 1 777 1234 1234 =a)\\040b\\012(c =job\\000--x\\000 ! =0::/job =0"
P43 = "p 43 R 1 900 0 0 =python3 =/usr/bin/python3\\000train.py\\000 =/usr/bin/python3.11 =0::/ =0"
PROCS = f"procs\nc 100 17.5\n{P43}\n{P42}\nu 0 =root\nu 1234 !\n"
MINORS = "minors\n0000:18:00.0 0\n"
FUSER_OK = (
    "fuser 0\n/d/nvidia0:          alice   42 F...m\n                     root    43 F...m\n"
    "\n@gpubot view - 0\n"
)


def out(*sections: str) -> CommandResult:
    return CommandResult(("sh",), 0, "".join(f"\n@gpubot {s}" for s in sections), "")


def full(apps: str = "43, GPU-00000000-aaaa-bbbb-cccc-000000000000, 100\n") -> list[str]:
    return [
        "probe 5 -\n",
        "gpus-err\n",
        "gpus 0\n" + gpus_text(1),
        "apps-err\n",
        "apps 0\n" + apps,
        MINORS,
        FUSER_OK,
        PROCS,
        "end\n",
    ]


def with_fuser(fuser: str) -> CommandResult:
    """A probe output with no GPU work and the given fuser section (status, then body)."""
    return out(
        "probe 5 -\n",
        "gpus-err\n",
        "gpus 0\n",
        "apps-err\n",
        "apps 0\n",
        MINORS,
        f"fuser {fuser}\n@gpubot view - 0\n",
        "procs\nc 1 1\n",
        "end\n",
    )


def test_parse_probe_minimal() -> None:
    r = out(
        "probe 5 -\n",
        "gpus-err\n",
        "gpus 0\n" + gpus_text(1),
        "apps-err\n",
        "apps 0\n",
        MINORS,
        "fuser 1\n\n@gpubot view - 0\n",
        "procs\nc 100 5.0\n",
        "end\n",
    )
    snap = parse_probe(NODE, r, 1.0)
    assert len(snap.gpus) == 1 and snap.processes == () and snap.ctl_only == ()


def test_parse_probe_full() -> None:
    snap = parse_probe(NODE, out(*full()), 1.0)
    got = {p.pid: p for p in snap.processes}
    assert set(got) == {42, 43}
    a, b = got[42], got[43]
    assert (a.user, a.uid, a.state, a.start_ticks, a.elapsed_s, a.hidden) == (
        "1234",
        1234,
        "S",
        777,
        9,
        True,
    )
    assert (a.process_name, a.command, a.exe, a.argv0) == ("a) b\\x0a(c", "job --x", None, "job")
    assert (b.user, b.used_memory_mib, b.exe, b.argv0) == (
        "root",
        100,
        "/usr/bin/python3.11",
        "/usr/bin/python3",
    )


@pytest.mark.parametrize(
    ("result", "error", "match"),
    [
        (out("probe 5 -\n", "gpus-err\n", "gpus 0\n" + gpus_text(1)), ParseError, "cut short"),
        (CommandResult(("sh",), 2, "", "sh: 0: cannot open x"), ProbeError, "probe failed"),
        (CommandResult(("sh",), 0, "hello\n", ""), ParseError, "no section marker"),
        (out("probe 5 -\n", "fatal no-timeout\n", "end\n"), ProbeError, "timeout"),
        (with_fuser("127\nsh: fuser: not found\n"), ProbeError, "fuser \\(psmisc\\) not found"),
        (
            with_fuser("0\n/etc/passwd: root 1 f.... x\n"),
            ParseError,
            "did not ask",
        ),
        (out("probe 5 -\n", "gpus-err\n", "gpus x\n", "end\n"), ParseError, "status"),
        (out(*full()[:-1], "end\ntrailing\n"), ParseError, "after the end"),
        (out(*full()[:2], full()[2], *full()[2:]), ParseError, "out of order or repeated"),
        (out(*full()[:7], PROCS + P42 + "\n", "end\n"), ParseError, "unexpected line"),
        (out(*full()[:7], PROCS.replace("u 0", f"{P43}\nu 0"), "end\n"), ParseError, "twice"),
        (
            out(*full()[:7], PROCS.replace(f"{P43}\n{P42}", f"{P42}\n{P43}"), "end\n"),
            ParseError,
            "not as asked",
        ),
        (out(*full()[:7], PROCS.replace(f"{P42}\n", ""), "end\n"), ParseError, "not as asked"),
        (out(*full()[:7], PROCS.replace("u 1234 !\n", ""), "end\n"), ParseError, "owner names"),
        (out(*full()[:7], PROCS.replace("=job", "=j ob"), "end\n"), ParseError, "process line"),
        (out(*full()[:7], PROCS.replace("=job", "=j\\9ob"), "end\n"), ParseError, "escaped"),
        (out(*full()[:7], PROCS.replace("=job", "job"), "end\n"), ParseError, "escaped"),
        (
            out(*full()[:7], PROCS.replace(" 1234 1234 ", " 1234 - "), "end\n"),
            ParseError,
            "owner names|uid",
        ),
        (
            CommandResult(("sh",), 0, "junk" + out(*full()).stdout, ""),
            ParseError,
            "before the first",
        ),
    ],
)
def test_parse_probe_errors(result: CommandResult, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        parse_probe(NODE, result, 1.0)


def _mutations(text: str, data: st.DataObject) -> str:
    """Duplicate, drop, swap or cut the sections (or lines) of a good probe output."""
    parts = text.split("\n@gpubot ")
    kind = data.draw(st.sampled_from(["dup", "drop", "swap", "cut", "dupline", "swapline"]))
    if kind == "cut":
        return text[: data.draw(st.integers(0, len(text) - 1))]
    if kind in ("dupline", "swapline"):
        lines = text.split("\n")
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines) - 1))
        # Lines move within the bodies gpubot makes (fuser, procs); nvidia-smi's own are trusted.
        ours = [k for k, ln in enumerate(lines) if re.match(r"[pgu] |c |/d/|  ", ln)]
        i, j = ours[i % len(ours)], ours[j % len(ours)]
        if kind == "dupline":
            lines.insert(j, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    i = data.draw(st.integers(1, len(parts) - 1))
    j = data.draw(st.integers(1, len(parts) - 1))
    if kind == "dup":
        parts.insert(j, parts[i])
    elif kind == "drop":
        del parts[i]
    else:
        parts[i], parts[j] = parts[j], parts[i]
    return "\n@gpubot ".join(parts)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_mangled_probe_output_is_an_error_never_a_different_table(data: st.DataObject) -> None:
    good = out(*full())
    expected = parse_probe(NODE, good, 1.0)
    mangled = _mutations(good.stdout, data)
    try:
        got = parse_probe(NODE, CommandResult(("sh",), 0, mangled, ""), 1.0)
    except (ParseError, ProbeError):
        return
    assert got == expected  # what parses at all is the very same table


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_any_text_a_process_says_of_itself_stays_inside_its_field(text: str) -> None:
    # What the awk escaper does, in Python: every byte but printable ASCII (no space, no \) as \ooo.
    raw = text.encode()
    esc = "=" + "".join(chr(b) if 33 <= b < 127 and b != 92 else f"\\{b:03o}" for b in raw)
    line = f"p 7 S 1 5 1000 1000 {esc} {esc} {esc} =0::/ =0"
    procs = parse_procs(out(f"procs\nc 100 1.0\n{line}\nu 1000 !\n", "end\n").stdout, [7])
    p = procs[7]
    assert p.exe == raw.decode("utf-8", errors="replace")
    assert "\n" not in p.command and "\n" not in p.comm and p.user == "1000"


def test_vanished_and_unresolved() -> None:
    procs = parse_procs(
        out(f"procs\nc 100 17.5\n{P42}\ng 43\nu 1234 !\n", "end\n").stdout, [42, 43]
    )
    assert set(procs) == {42}  # 43 vanished: the script said so
    p = procs[42]
    assert (p.ppid, p.state, p.start_ticks, p.user, p.uid, p.elapsed_s) == (
        1,
        "S",
        777,
        "1234",
        1234,
        9,
    )
    assert (p.command, p.wchan, p.cgroup, p.comm) == ("job --x", None, "0::/job", "a) b\\x0a(c")
    with pytest.raises(ParseError):
        parse_procs(out("procs\n", "end\n").stdout, [])  # no clock line


# ---- fuser ------------------------------------------------------------------------------------

FUSER = """\
                     USER        PID ACCESS COMMAND
/tmp/a/very/long/path/of/the/node/dev/nvidia0:
                     root       8282 f.... sleep
                     alice      8283 F...m
Cannot stat file /proc/1/fd/7: Permission denied
/d/nvidiactl:        root       8283 f.... python3
/d/nvidia-uvm:       root     kernel mount /d/nvidia-uvm
"""


def test_parse_fuser_table() -> None:
    assert parse_fuser(FUSER) == (
        DeviceHolder(
            "/tmp/a/very/long/path/of/the/node/dev/nvidia0", 8282, "root", "f....", "sleep"
        ),
        DeviceHolder("/tmp/a/very/long/path/of/the/node/dev/nvidia0", 8283, "alice", "F...m", ""),
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


def test_a_name_shaped_like_a_fuser_line_adds_no_holder(box: Box) -> None:
    # comm "x\\na 9 F...m": were it printed raw, it would claim that pid 9 holds nvidia0.
    libc = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'x\\na 9 F...m', 0, 0, 0); "
    fd = os.open(f"{box.node.dev_prefix}0", os.O_RDONLY)
    job = subprocess.Popen([sys.executable, "-c", libc + "time.sleep(60)"], pass_fds=[fd])
    os.close(fd)
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{job.pid}/comm").read_bytes() != b"x\na 9 F...m\n":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        box.set(gpus=gpus_text(), apps="")
        snap = probe(box)
        on0 = {p.pid: p for p in snap.processes if p.gpu_index == 0}
        assert 9 not in on0 and on0[job.pid].process_name == "x\\x0aa 9 F...m"
    finally:
        job.kill()
        job.wait()


def test_proc_argv_runs_for_real(box: Box) -> None:
    a, d = box.pids["A"], box.pids["D"]
    argv = proc_argv([a, d, box.gone, a])
    assert argv[:3] == ["bash", "-c", argv[2]] and "sudo" not in argv  # reading needs no privilege
    procs = parse_procs(run(argv).stdout, [a, d, box.gone])
    assert set(procs) == {a, d}
    assert procs[d].start_ticks == start_ticks(d) and procs[d].command.endswith(" 120")
    assert procs[a].ppid == os.getpid()


def test_printable_escapes_what_would_break_a_table() -> None:
    assert printable("ok name") == "ok name"
    assert printable("a\nb\tc\u202ed") == "a\\x0ab\\x09c\\x202ed"


def test_holders_go_to_the_gpu_their_device_minor_names(box: Box) -> None:
    # A box whose driver numbered the device files apart from the GPU indices (documented on
    # A100 systems): nvidia2 is GPU 0, nvidia0 is GPU 1, nvidia1 is GPU 2.
    driver = Path(box.node.driver_dir)
    set_minors(driver, [2, 0, 1])
    try:
        box.set(gpus=gpus_text(), apps=f"{box.pids['A']}, {U[0]}, 2048\n")
        snap = probe(box)
        assert [(g.index, g.minor) for g in snap.gpus] == [(0, 2), (1, 0), (2, 1)]
        got = {(p.pid, p.gpu_index, p.hidden) for p in snap.processes}
        # B holds nvidia1 (GPU 2), D holds nvidia2 (GPU 0); A is listed by nvidia-smi on GPU 0.
        assert got == {
            (box.pids["A"], 0, False),
            (box.pids["B"], 2, True),
            (box.pids["D"], 0, True),
        }
        set_minors(driver, [0, None, 2])  # the driver names no minor for GPU 1
        snap = probe(box)
        gpu1 = snap.gpu(1)
        assert gpu1 is not None and gpu1.minor is None
        assert "device-file-unknown" in gpu_flags(snap.gpus[1], snap.on_gpu(1))
        assert box.pids["B"] not in {p.pid for p in snap.processes}  # nvidia1 is nobody's GPU
        with pytest.raises(ResetRefused, match="cannot tell which device file is GPU 1"):
            plan_reset(snap, ResetRequest("n1", "root", gpus=(1,)), Protection())
        set_minors(driver, [0, 0, 2])
        with pytest.raises(ParseError, match="two GPUs on one device file"):
            probe(box)
    finally:
        set_minors(driver, [0, 1, 2])


@pytest.mark.parametrize(
    ("fuser", "view", "unseen", "hidepid"),
    [
        ("~unseen 3\n", "-", 3, None),
        ("", "2", 0, "2"),
        ("", "invisible", 0, "invisible"),
        ("", "0", 0, None),
    ],
)
def test_a_partial_view_is_noted(fuser: str, view: str, unseen: int, hidepid: str | None) -> None:
    head = ["probe 5 -\n", "gpus-err\n", "gpus 0\n" + gpus_text(1), "apps-err\n", "apps 0\n"]
    r = out(*head, MINORS, f"fuser 1\n{fuser}", f"view {view} 0\n", "procs\nc 100 5.0\n", "end\n")
    snap = parse_probe(NODE, r, 1.0)
    assert (snap.unseen, snap.hidepid) == (unseen, hidepid)
    assert len([n for n in snap.notes if n.startswith("partial view")]) == bool(unseen) + bool(
        hidepid
    )
    with pytest.raises(ParseError):
        bad = out(*head, MINORS, "fuser 1\n", "view x;y 0\n", "procs\nc 1 1\n", "end\n")
        parse_probe(NODE, bad, 1.0)


def test_an_ordinary_account_without_sudo_sees_part_of_the_node() -> None:
    # psmisc's fuser skips, without a word, the processes it may not look into.
    head = ["probe 5 -\n", "gpus-err\n", "gpus 0\n" + gpus_text(1), "apps-err\n", "apps 0\n"]
    r = out(*head, MINORS, "fuser 1\n", "view - 1000\n", "procs\nc 100 5.0\n", "end\n")
    snap = parse_probe(NODE, r, 1.0)
    assert [n for n in snap.notes if "uid 1000, without sudo" in n]
    assert not parse_probe(replace(NODE, sudo=True), r, 1.0).notes  # sudo fuser sees them all


def _logging_path(tmp: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose every program (all of the real PATH's, and sbin's) logs its name, then runs."""
    bindir, log = tmp / "bin", tmp / "execs.log"
    bindir.mkdir()
    log.write_text("")
    for folder in [*os.environ["PATH"].split(":"), "/usr/sbin", "/sbin"]:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            wrapper = bindir / e.name
            if wrapper.exists() or not re.fullmatch(r"[\w.+-]+", e.name):
                continue
            if not (e.is_file() and os.access(e.path, os.X_OK)):
                continue
            wrapper.write_text(f'#!/bin/sh\necho {e.name} >>{log}\nexec {e.path} "$@"\n')
            wrapper.chmod(0o755)
    return {**os.environ, "PATH": str(bindir)}, log


def test_the_probe_runs_four_programs_and_no_proc_work_for_idle_gpus(
    box: Box, tmp_path: Path
) -> None:
    # Every program the probe starts by name is logged; nvidia-smi logs its own calls. bash
    # itself is the fourth.
    env, log = _logging_path(tmp_path)
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch(mode=0o644)
    node = replace(box.node, dev_prefix=f"{dev}/nvidia")

    def programs() -> list[str]:
        smi = [f"nvidia-smi:{c.split('=')[0]}" for c in box.calls()]
        ran = sorted(log.read_text().split() + smi)
        log.write_text("")
        box.set()
        return ran

    queries = ["nvidia-smi:--query-compute-apps", "nvidia-smi:--query-gpu"]
    box.set(gpus=gpus_text(), apps="")
    raw = run(probe_argv(node, smi_timeout_s=5), env)
    assert parse_probe(node, raw, 1.0).processes == ()
    assert "\n@gpubot procs\nc - -\n\n@gpubot end" in raw.stdout  # no /proc read at all
    assert programs() == ["fuser", *queries]

    # Two jobs of an ordinary user: one nvidia-smi lists on GPU 0, one hidden on GPU 1.
    jobs = []
    for files in (["nvidia0", "nvidiactl"], ["nvidia1"]):
        fds = [os.open(dev / f, os.O_RDONLY) for f in files]
        jobs.append(subprocess.Popen(["sleep", "60"], pass_fds=fds, user="nobody"))
        for fd in fds:
            os.close(fd)
    try:
        box.set(gpus=gpus_text(), apps=f"{jobs[0].pid}, {U[0]}, 2048\n")
        snap = probe(box, node=node, env=env)
        assert {(p.pid, p.gpu_index, p.user) for p in snap.processes} == {
            (jobs[0].pid, 0, "nobody"),
            (jobs[1].pid, 1, "nobody"),
        }
        assert programs() == ["fuser", *queries]
        # A process of a system account costs one readlink: its executable is what protects it.
        fd = os.open(dev / "nvidia2", os.O_RDONLY)
        jobs.append(subprocess.Popen(["sleep", "60"], pass_fds=[fd]))
        os.close(fd)
        box.set(gpus=gpus_text(), apps=f"{jobs[0].pid}, {U[0]}, 2048\n")
        snap = probe(box, node=node, env=env)
        assert {p.user for p in snap.processes} == {"nobody", "root"}
        assert programs() == ["fuser", *queries, "readlink"]
    finally:
        for j in jobs:
            j.kill()
            j.wait()
