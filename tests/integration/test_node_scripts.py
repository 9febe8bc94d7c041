"""The node-side shell scripts (the Xid read, the reset readiness check, Slurm's enrichment) run
under a real sh or bash with stand-in programs on PATH; their parsers' tables are unit tests."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpubot.core.enrich import enrich_argv
from gpubot.core.health.kernlog import (
    MAX_LINE_BYTES,
    MAX_LINES,
    kernlog_argv,
    parse_event,
    parse_kernlog,
)
from gpubot.core.reset.readiness import readiness, ready_argv
from gpubot.core.runtimes.base import Found
from gpubot.core.runtimes.slurm import parse_scontrol
from tests.fixtures.node_samples import FORGED_USER, LINE79, TOPO_MIXED, gpu, job_record, proc, snap


def _fake_smi(tmp: Path, topo: str | None, modes: str | None) -> str:
    """A stand-in nvidia-smi: prints ``topo``/``modes`` or fails like an old driver."""
    (tmp / "topo.txt").write_text(topo or "")
    (tmp / "modes.txt").write_text(modes or "")
    script = tmp / "nvidia-smi"
    topo_cmd = f"cat {tmp / 'topo.txt'}" if topo else "echo Invalid combination; exit 2"
    modes_cmd = f"cat {tmp / 'modes.txt'}" if modes else "echo Field is not valid; exit 2"
    script.write_text(
        f'#!/bin/sh\ncase "$1" in\n  topo) {topo_cmd} ;;\n  --query-gpu=*) {modes_cmd} ;;\nesac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_ready_script_under_sh_with_a_full_driver(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, TOPO_MIXED, "2, Disabled, Enabled\n")
    # A box without the daemon, whatever runs on this one (another test's simulated daemon):
    # procps's ps prints nothing and exits 1 when no process has that name.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ps").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "ps").chmod(0o755)
    out = subprocess.run(
        ready_argv(smi, [2], 5),
        capture_output=True,
        text=True,
        timeout=20,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert "\n@gpubot topo 0\n" in out.stdout and "\n@gpubot modes 0\n" in out.stdout
    assert out.stdout.rstrip().endswith("\n@gpubot end")
    s = snap(gpu(2, 8192))
    (r,) = readiness(s, [2], out.stdout).values()
    assert (r.gpu, r.nvlink_peers, r.mig_mode, r.persistence_mode) == (
        2,
        (3,),
        "Disabled",
        "Enabled",
    )
    assert r.persistence_daemon == "not running"  # no nvidia-persistenced on this box
    assert r.lines() == [
        "processes on GPU 2: none",
        "persistence daemon: not running (persistence mode Enabled)",
        "NVLink peers: GPU 3 (may reset too)",
        "MIG mode: Disabled",
    ]


def test_ready_script_when_the_driver_cannot_say(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, None, None)
    out = subprocess.run(ready_argv(smi, [0, 1], 5), capture_output=True, text=True, timeout=20)
    s = snap(gpu(0, 8192), gpu(1, 100), procs=(proc(7, g=1, name="nvidia-persistenced"),))
    r = readiness(s, [0, 1], out.stdout)
    assert r[0].nvlink_peers is None and r[0].mig_mode is None
    assert "NVLink peers: unknown (nvidia-smi topo -m is not available here)" in r[0].lines()
    assert "MIG mode: unknown" in r[0].lines()
    assert r[1].processes == ("nvidia-persistenced (pid 7, alice)",)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_slurm_script_runs_under_sh(tmp_path: Path) -> None:
    fake = tmp_path / "scontrol"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$3" = 2 ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }\n'
        'cat "$(dirname "$0")/job$3"\n'
    )
    fake.chmod(0o755)
    (tmp_path / "job1").write_text(job_record("1", "sweep lr", "bob", 1001))
    (tmp_path / "job3").write_text(job_record("3", "evil\n" + FORGED_USER))
    argv = enrich_argv("slurm", ["1", "2", "3"], timeout_s=10, sudo=False)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    found = parse_scontrol(r.stdout, ["1", "2", "3"])
    assert found == {"1": Found(name="sweep lr", user="bob", uid=1001, state="RUNNING")}


def test_the_script_is_bounded_and_prefers_the_journal(tmp_path: Path) -> None:
    """The real script under bash, with stand-in programs on PATH: a flood of long lines comes
    back as at most MAX_LINES lines of at most MAX_LINE_BYTES, the cursor last."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flood = tmp_path / "flood.txt"
    long_line = LINE79 + " " + "x" * 2000
    flood.write_text("\n".join([long_line] * 1000 + ["-- cursor: s=z;i=9"]) + "\n")
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {flood}\n")
    (bin_dir / "journalctl").chmod(0o755)
    for prog in ("bash", "grep", "tail", "cut", "head", "cat", "sed", "sort", "uniq"):
        src = subprocess.run(["sh", "-c", f"command -v {prog}"], capture_output=True, text=True)
        (bin_dir / prog).symlink_to(src.stdout.strip())
    argv = kernlog_argv(None, 3600)
    out = subprocess.run(argv, capture_output=True, text=True, env={"PATH": str(bin_dir)})
    got = parse_kernlog(out.stdout)
    assert got.source == "journal" and got.cursor == "s=z;i=9"
    assert 0 < len(got.lines) <= MAX_LINES and all(len(x) <= MAX_LINE_BYTES for x in got.lines)
    assert got.counts == {(False, "0000:18:00", 79): 1000}  # what the cap dropped is counted
    assert all(parse_event(x) is not None for x in got.lines)


@pytest.mark.parametrize(
    ("journal", "source", "denied"),
    [
        # systemd 252 with no journal on the box (as on this machine): exit 1, stderr only
        ("echo 'No journal files were found.' >&2; exit 1", "dmesg", "no journal on the node"),
        # an account outside systemd-journal/adm: the hint, exit 0 (the control for -q: with -q
        # journalctl prints no hint and the read would wrongly trust an empty journal)
        (
            "echo 'Hint: You are currently not seeing messages from other users and the system.'"
            " >&2",
            "dmesg",
            "not in the systemd-journal or adm group",
        ),
        ("echo 'Failed to seek to cursor: Invalid argument' >&2; exit 1", "journal", None),
    ],
)
def test_the_script_falls_back_to_dmesg_when_the_journal_says_so(
    tmp_path: Path, journal: str, source: str, denied: str | None
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\n{journal}\n")
    (bin_dir / "dmesg").write_text(f"#!/bin/sh\necho '{LINE79.replace(' n1 kernel:', '')}'\n")
    for prog in ("journalctl", "dmesg"):
        (bin_dir / prog).chmod(0o755)
    for prog in ("bash", "grep", "tail", "cut", "head", "sh", "sed", "sort", "uniq"):
        src = subprocess.run(["sh", "-c", f"command -v {prog}"], capture_output=True, text=True)
        (bin_dir / prog).symlink_to(src.stdout.strip())
    out = subprocess.run(
        kernlog_argv("s=a;i=1", 60), capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )
    got = parse_kernlog(out.stdout)
    assert got.source == source
    if denied is not None:
        assert got.denied == (f"journal-denied {denied}",) and len(got.lines) == 1
    else:
        assert got.cursor_lost


def test_the_script_keeps_and_counts_the_mig_prefix(tmp_path: Path) -> None:
    """NVIDIA's documented MIG line (tests/corpus/kernlog/ogkm-error-cont-xid94-mig.txt) passes
    the node's filter and is counted under its GPU; a forged attribution does not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mig = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9)."
    ci = "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception"
    forged = "NVRM: Xid (PCI:0000:02:00 GPU-I:05 x): 79, forged"
    log = tmp_path / "log.txt"
    ts = "2026-05-01T10:00:00+0000 n1 kernel: "
    log.write_text("".join(f"{ts}{x}\n" for x in (mig, ci, forged)) + "-- cursor: s=z;i=9\n")
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {log}\n")
    (bin_dir / "journalctl").chmod(0o755)
    for prog in ("bash", "grep", "tail", "cut", "head", "cat", "sed", "sort", "uniq"):
        src = subprocess.run(["sh", "-c", f"command -v {prog}"], capture_output=True, text=True)
        (bin_dir / prog).symlink_to(src.stdout.strip())
    out = subprocess.run(
        kernlog_argv(None, 3600), capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )
    got = parse_kernlog(out.stdout)
    assert got.lines == (f"{ts}{mig}", f"{ts}{ci}")  # application codes after the others
    assert got.counts == {(False, "0000:01:00", 94): 1, (False, "0000:01:00", 13): 1}
