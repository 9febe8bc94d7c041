"""The stuck-query check reads the probe's own records, not every process (issue 24).

Each nvidia-smi query the probe starts records ``PID START-TICKS`` in the login account's private
runtime folder before it execs; the next probe looks at those processes only. A query left
behind by a probe that died mid-query is found from its record; a record names a process only by
PID and start time and must still pass ``own_query``; a folder anyone else could write is never
used; the first probe in a folder (no "ok" mark) walks ``/proc`` once and records what it finds.
Run by real bash against a stand-in nvidia-smi (``tests.unit.test_probe``'s).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.probe import guards as probe_guards
from gpubot.core.probe import script as probe_script
from gpubot.core.probe.nvsmi import gpu_query_argv
from gpubot.core.probe.snapshot import parse_probe, probe_argv
from gpubot.errors import SmiFailed
from tests.fixtures.probe_box import SMI, gpus_text, run, set_minors
from tests.procs import start_ticks

MARK = "gpubot-probe.ok"


@dataclass
class Node:
    dir: Path
    cfg: NodeConfig
    state: Path

    def mode(self, mode: str) -> None:
        (self.dir / "mode").write_text(mode)

    def probe(self, state: str | None = None, t: float = 5) -> NodeSnapshot:
        argv = probe_argv(self.cfg, smi_timeout_s=t, budget_s=60, state_dir=state)
        return parse_probe(self.cfg, run(argv), 1.0)

    def records(self) -> list[tuple[int, int]]:
        out = []
        for k in range(3):
            f = self.state / f"gpubot-probe.q{k}"
            if f.exists():
                out += [
                    (int(a), int(b))
                    for a, b in (ln.split() for ln in f.read_text().split("\n") if ln)
                ]
        return out


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    set_minors(tmp_path / "driver", [0])
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    (tmp_path / "gpus").write_text(gpus_text(1))
    (tmp_path / "apps").write_text("")
    state = tmp_path / "run"
    state.mkdir(mode=0o700)
    cfg = NodeConfig(
        name="n1",
        host="unused",
        dev_prefix=f"{dev}/nvidia",
        nvidia_smi=str(smi),
        driver_dir=str(tmp_path / "driver"),
    )
    yield Node(tmp_path, cfg, state)


def kill(pid: int, ticks: int) -> None:
    """Kill our own process ``pid`` if it is still the one that started at ``ticks``."""
    try:
        if start_ticks(pid) == ticks:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def left_behind(node: Node) -> tuple[int, int]:
    """Start a probe whose first query never answers, kill the probe (not its query) once the
    query has recorded itself: a probe that died mid-query. Return the query's (pid, ticks)."""
    node.mode("stubborn")  # a query of ours that never ends (TERM ignored)
    argv = probe_argv(node.cfg, smi_timeout_s=30, budget_s=60, state_dir=str(node.state))
    p = subprocess.Popen(
        [shutil.which("bash") or "/bin/bash", *argv[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not (new := [r for r in node.records() if Path(f"/proc/{r[0]}").exists()]):
            assert time.monotonic() < deadline, "no record of the query"
            time.sleep(0.05)
        ((pid, ticks),) = new
        while Path(f"/proc/{pid}/comm").read_text() != "nvidia-smi\n":
            time.sleep(0.02)  # recorded before its exec: the job, then the query itself
    finally:
        p.kill()  # the probe alone, by PID: its query stays, as a query in the kernel would
        p.wait()
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()
        p.stderr.close()  # the watchdog's next write fails: it goes too
    return pid, ticks


def test_each_query_records_itself_and_the_first_probe_marks_the_folder(node: Node) -> None:
    snap = node.probe(str(node.state))
    assert len(snap.gpus) == 1
    assert (node.state / MARK).read_text() == "ok\n"  # walked /proc once, found nothing
    recs = node.records()
    assert len(recs) == 2 and all(not Path(f"/proc/{p}").exists() for p, _ in recs)
    node.probe(str(node.state))
    assert len(node.records()) == 4  # a finished query's record is dropped when its file rotates


def test_a_query_a_dead_probe_left_behind_is_found_from_its_record(node: Node) -> None:
    node.probe(str(node.state))  # the folder is marked: from now on only records are read
    pid, ticks = left_behind(node)
    try:
        node.mode("")
        time.sleep(2.2)  # older than the limit of a 0.3 s query: 2 × 0 + 2 s
        with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {pid} stuck for 2s"):
            node.probe(str(node.state), t=0.3)
        # Only the records are read: with them gone (the mark kept), nothing is found.
        for k in range(3):
            (node.state / f"gpubot-probe.q{k}").write_text("")
        assert len(node.probe(str(node.state), t=0.3).gpus) == 1
        # Without a records folder the probe walks /proc, and finds it again.
        with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {pid} stuck"):
            node.probe("", t=0.3)
    finally:
        kill(pid, ticks)


def test_the_first_probe_in_a_folder_walks_proc_and_records_what_it_finds(node: Node) -> None:
    # A stuck query from before the records (an upgrade, a new boot's folder): not recorded.
    node.mode("stubborn")
    ours = subprocess.Popen(gpu_query_argv(node.cfg.nvidia_smi), start_new_session=True)
    try:
        time.sleep(2.2)
        node.mode("")
        with pytest.raises(SmiFailed, match=rf"nvidia-smi pid {ours.pid} stuck"):
            node.probe(str(node.state), t=0.3)
        assert (ours.pid, start_ticks(ours.pid)) in node.records()
        assert (node.state / MARK).read_text() == "ok\n"
        with pytest.raises(SmiFailed, match=rf"nvidia-smi pid {ours.pid} stuck"):
            node.probe(str(node.state), t=0.3)  # now from its record
    finally:
        ours.kill()
        ours.wait()


def test_planted_or_stale_records_never_blind_the_node(node: Node) -> None:
    # Records that name no query of ours: a process of another user running our query's argv, a
    # process of ours that is no query, a PID with another start time, and garbage.
    fake = Path(tempfile.mkdtemp(prefix="gpubot-fake-smi-"))
    fake.chmod(0o755)
    shutil.copy("/bin/sleep", fake / "nvidia-smi")
    argv = [node.cfg.nvidia_smi, "60"]
    theirs = subprocess.Popen(argv, executable=fake / "nvidia-smi", user="nobody")
    mine = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(2.2)
        node.probe(str(node.state))
        lines = [
            f"{theirs.pid} {start_ticks(theirs.pid)}",
            f"{mine.pid} {start_ticks(mine.pid)}",
            f"{mine.pid} {start_ticks(mine.pid) + 1}",
            "1 x",
            f"$(touch {node.dir}/pwned) 1",
        ]
        for k in range(3):
            (node.state / f"gpubot-probe.q{k}").write_text("\n".join(lines) + "\n")
        assert len(node.probe(str(node.state), t=0.3).gpus) == 1
        assert not (node.dir / "pwned").exists()
    finally:
        for p in (theirs, mine):
            p.kill()
            p.wait()
        shutil.rmtree(fake)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder of another user's")
def test_a_folder_another_account_could_write_is_never_used(node: Node, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)  # nobody's: they could plant or remove records there
    link = tmp_path / "link"
    link.symlink_to(node.state)
    for folder in (theirs, link):
        node.probe(str(folder))
        assert list(theirs.iterdir()) == [] and list(node.state.iterdir()) == []


# ---- the rotation, with the node's uptime chosen ----------------------------------------------


def rotate(state: Path, uptime_s: float) -> str:
    """Run the records check once at ``uptime_s``; return what it printed (stuck lines)."""
    script = (
        probe_script._COMMON
        + probe_guards.STUCK
        + f"uptime_ticks() {{ up={round(uptime_s * 100)}; }}\n"
        + f"smi=/x T=9 me={os.geteuid()} B= SD=$1\n"
        + 'GQ=(-q) AQ=(-a); stuck_recorded; printf "%s" "$out"'
    )
    p = subprocess.run(["bash", "-c", script, "t", str(state)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_rotation_carries_live_records_and_empties_the_old_file(tmp_path: Path) -> None:
    mine = subprocess.Popen(["sleep", "60"])
    try:
        live = f"{mine.pid} {start_ticks(mine.pid)}"
        done = subprocess.Popen(["true"])
        done.wait()
        gone = f"{done.pid} 5"  # a process that ended
        q = [tmp_path / f"gpubot-probe.q{k}" for k in range(3)]
        # minute 100 (uptime 6000 s): appends go to q1 (100 % 3); q2 is two minutes old.
        q[2].write_text(f"{live}\n{gone}\n")
        rotate(tmp_path, 6040)  # the second half of the minute: nothing moves
        assert q[2].read_text() == f"{live}\n{gone}\n" and not q[1].exists()
        rotate(tmp_path, 6010)  # the first half: the live record moves, q2 empties
        assert q[1].read_text() == f"{live}\n" and q[2].read_text() == ""
        rotate(tmp_path, 6070)  # minute 101: q1 is now this one's, not moved
        assert q[1].read_text() == f"{live}\n"
        rotate(tmp_path, 6125)  # minute 102: q0 is now; q1 two minutes old: carried
        assert q[0].read_text() == f"{live}\n" and q[1].read_text() == ""
    finally:
        mine.kill()
        mine.wait()
