"""What bounds the probe's cost (issue 21), run by real bash: the escaping, the argv cap, the time
budget's marker, and holders of only the control files never read."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubot.core.models import CommandResult, GpuInfo, NodeConfig
from gpubot.core.probe import guards as probe_guards
from gpubot.core.probe import script as probe_script
from gpubot.core.probe.fields import parse_proc_lines
from gpubot.core.probe.snapshot import NvmlKnown, parse_probe, probe_argv
from gpubot.errors import ParseError, ProbeError


def reference(raw: bytes) -> str:
    """The escaped form the parser reads: printable ASCII but backslash stays, the rest \\ooo."""
    return "=" + "".join(chr(c) if 0x21 <= c <= 0x7E and c != 0x5C else f"\\{c:03o}" for c in raw)


def bash(script: str, *args: bytes) -> bytes:
    argv = [b"bash", b"-c", script.encode(), b"t", *args]
    return subprocess.run(argv, capture_output=True, timeout=60, check=True).stdout


SAMPLES = [
    bytes(range(1, 256)),
    bytes(random.Random(21).randrange(1, 256) for _ in range(4096)),
    "h\u00e9llo w\u00f6rld \\ \t\n x \u6f22\u5b57 \u202e".encode(),
    b"\\'\\n \\\\ '\"\\303 $'x'",
    b"plain-ascii",
    b"",
]


@pytest.mark.parametrize("raw", SAMPLES, ids=range(len(SAMPLES)))
def test_both_escaping_paths_give_exactly_the_format_the_parser_reads(raw: bytes) -> None:
    common = probe_script._COMMON
    fast = bash(common + 'esc "$1"; printf "%s" "$R"', raw).decode()
    slow = bash(common + 'esc_slow "${1:0:4096}"', raw).decode()  # the fallback, for other bashes
    assert fast == reference(raw[:4096])
    assert "=" + slow == reference(raw[:4096])


def started(argv: list[str | bytes], executable: str | None = None) -> subprocess.Popen[bytes]:
    """A process whose argv can be read: Popen returns once exec is past its point of no return,
    but the kernel sets the new argv's bounds later, and until then /proc/PID/cmdline reads empty
    (nearly always, for an argv of 100,000 NULs)."""
    p = subprocess.Popen(argv, executable=executable)
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{p.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the process's argv never appeared"
        time.sleep(0.001)
    return p


def test_argv_is_capped_before_it_is_escaped() -> None:
    # 100 arguments of 100 bytes: at most 64 arguments and 4096 bytes of them are read.
    args = [bytes([0xC3, 0xA9]) * 50 for _ in range(100)]
    p = started([sys.executable, "-c", "import time; time.sleep(60)", *args])
    try:
        out = bash(
            probe_script._COMMON + probe_script._PROCS + 'argv_of "/proc/$1/cmdline"; '
            'printf "%s" "$R"',
            str(p.pid).encode(),
        ).decode()
    finally:
        p.kill()
        p.wait()
    got = out[1:].split("\\000")[:-1]
    assert len(got) <= 64 and sum(len(a) for a in got) <= 4 * 4096
    assert got[:3] == [sys.executable, "-c", "import\\040time;\\040time.sleep(60)"]
    assert got[3] == "\\303\\251" * 50


SLEEPER = ["/usr/bin/python3", "-c", "import time; time.sleep(60)"]  # 48 bytes with their NULs


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ([b""] * 100_000, [""] * 61),  # a flood of NULs: 64 arguments in all
        ([b"x" * 131_071], ["x" * (4096 - 48)]),  # the longest argument: 4096 bytes in all
    ],
    ids=["nul-flood", "one-huge-argument"],
)
def test_any_argv_is_read_only_up_to_its_caps(args: list[bytes], want: list[str]) -> None:
    p = started([*SLEEPER, *args], executable=sys.executable)
    try:
        got = bash(
            probe_script._COMMON + probe_script._PROCS + 'argv_of "/proc/$1/cmdline"; '
            'printf "%s" "$R"',
            str(p.pid).encode(),
        ).decode()
    finally:
        p.kill()
        p.wait()
    assert got == "=" + "".join(a.replace(" ", "\\040") + "\\000" for a in [*SLEEPER, *want])


def out(*sections: str) -> CommandResult:
    return CommandResult(("bash",), 0, "".join(f"\n@gpubot {s}" for s in sections), "")


NODE = NodeConfig(name="n9", host="h", dev_prefix="/d/nvidia")


@pytest.mark.parametrize(
    ("stage", "said"),
    [
        ("stuck", "looking for a stuck nvidia-smi"),
        ("fuser", "reading fuser's table"),
        ("procs", "reading /proc"),
    ],
)
def test_past_its_budget_the_node_is_unknown_never_a_timeout_nor_empty(
    stage: str, said: str
) -> None:
    partial = [
        "probe 9 -\n",
        "gpus-err\n",
        "gpus 0\n0, GPU-x, 0000:18:00.0, Disabled, H, 1, 2, 3\n",
    ]
    with pytest.raises(ProbeError, match=rf"time budget \(19s\) while {said}: .* unknown") as ei:
        parse_probe(NODE, out(*partial, f"over 19000 {stage}\n", "end\n"), 1.0)
    assert not isinstance(ei.value, TimeoutError)
    for bad in ("over 19000 elsewhere\n", "over x procs\n", "over 19000\n"):
        with pytest.raises(ParseError, match="over section"):
            parse_probe(NODE, out(*partial, bad, "end\n"), 1.0)


def test_a_control_file_holder_is_counted_from_fusers_rows_and_never_read(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    node = NodeConfig(
        name="n1",
        host="h",
        dev_prefix=f"{dev}/nvidia",
        nvidia_smi="/nonexistent",
        driver_dir=str(tmp_path / "drv"),
    )
    fds = [os.open(dev / f, os.O_RDONLY) for f in ("nvidiactl", "nvidia-uvm")]
    gpu = os.open(dev / "nvidia0", os.O_RDONLY)
    ctl = subprocess.Popen(["sleep", "60"], pass_fds=fds)
    job = subprocess.Popen(["sleep", "60"], pass_fds=[gpu, *fds])
    for fd in (*fds, gpu):
        os.close(fd)
    try:
        argv = probe_argv(node, smi_timeout_s=5, nvml=NvmlKnown([0], minors=[0]))
        raw = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    finally:
        for p in (ctl, job):
            p.kill()
            p.wait()
    procs = raw.split("\n@gpubot procs\n")[1].split("\n@gpubot end")[0]
    assert f"\np {job.pid} " in procs and f" {ctl.pid} " not in procs  # the job's /proc only
    fuser = raw.split("\n@gpubot fuser ")[1].split("\n@gpubot view")[0]
    assert f" {ctl.pid} " in fuser  # its rows go out: the parser counts it
    gpus = (GpuInfo(0, "GPU-x", "H200", 0, 1, 0, None, 0),)
    snap = parse_probe(node, CommandResult(tuple(argv), 0, raw, ""), 1.0, nvml=(gpus, ()))
    assert [(p.pid, p.gpu_index, p.hidden) for p in snap.processes] == [(job.pid, 0, True)]
    assert [h.pid for h in snap.ctl_only] == [ctl.pid]
    assert parse_proc_lines(procs, [job.pid])[job.pid].pid == job.pid


_OLD_GETENT = """  if [[ $uids != ' ' ]]; then
    while IFS=: read -r name _ u _; do
      [[ $uids == *" $u "* ]] || continue
      esc "$name"; printf 'u %s %s\\n' "$u" "$R"; uids=${uids/ $u / }
    done < <(getent passwd $uids 2>/dev/null)
  fi"""


@pytest.mark.parametrize("defended", [True, False], ids=["bounded", "control-unbounded"])
def test_a_slow_name_service_cannot_hold_the_probe_past_its_budget(
    tmp_path: Path, defended: bool
) -> None:
    # Two processes under uids /etc/passwd does not list; the name service (a stand-in getent on
    # PATH) takes 5 s, the budget is 1 s. The names stay unknown ("!") and the probe ends in
    # time; the control (the old unbounded lookup) waits for the name service.
    if os.geteuid() != 0:
        pytest.fail("this test starts processes under other uids: run it as root")
    getent = tmp_path / "getent"
    getent.write_text("#!/bin/sh\nsleep 5\nexit 2\n")
    getent.chmod(0o755)
    uids = [54321, 54322]
    procs = [subprocess.Popen(["sleep", "60"], user=u, stdin=subprocess.DEVNULL) for u in uids]
    procs_part = probe_script._PROCS
    if not defended:
        start = procs_part.index("  # NSS may be")
        end = procs_part.index("  fi", procs_part.index("getent passwd $ask")) + len("  fi")
        procs_part = procs_part[:start] + _OLD_GETENT + procs_part[end:]
        assert "getent passwd $uids" in procs_part
    script = (
        probe_script._COMMON
        + procs_part
        + 't=${EPOCHREALTIME//[!0-9]/}; DL=$(( 10#$t + 1000000 )); procs "$@"'
    )
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    try:
        t = time.monotonic()
        text = subprocess.run(
            ["bash", "-c", script, "t", *(str(p.pid) for p in procs)],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            check=True,
        ).stdout
        took = time.monotonic() - t
    finally:
        for p in procs:
            p.kill()
            p.wait()
    names = [line for line in text.splitlines() if line.startswith("u ")]
    assert names == [f"u {u} !" for u in uids]
    if defended:
        assert took < 4, took
    else:
        assert took >= 5, took  # the attack: the name service decides how long the probe runs


# T = 9 s (the default query limit), ages in clock ticks (100 a second).
STALE_CASES = [
    ("D", 50, False),  # a query of another probe of this node, in a driver call right now
    ("D", 900, False),
    ("D", 901, True),  # in the kernel past one query's limit: the driver is hung
    ("S", 1999, False),
    ("S", 2001, True),  # past twice the limit, whatever its state
    ("R", 2001, True),
]


@pytest.mark.parametrize(("state", "age", "stuck"), STALE_CASES)
def test_a_query_of_a_probe_running_beside_this_one_is_not_stuck(
    state: str, age: int, stuck: bool
) -> None:
    script = (
        probe_script._COMMON + probe_guards.STUCK + 'T=9; stale "$1" "$2" && echo yes || echo no'
    )
    assert bash(script, state.encode(), str(age).encode()).strip() == (b"yes" if stuck else b"no")


def test_control_the_old_rule_took_a_probe_beside_this_one_for_a_hung_driver() -> None:
    # The rule before: any query of ours in state D was stuck, so two probes of one node at the
    # same moment could report "driver hung" for each other.
    old = "T=9; lim=$(( 2 * ${T%%.*} + 2 )); [[ $1 == D ]] || (( $2 > lim * TCK )) && echo yes"
    assert bash(probe_script._COMMON + old, b"D", b"50").strip() == b"yes"
