"""Simulated workloads are real processes with real signals, device files and memory."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from gpusim import simstate
from gpusim.fleet import SimFleet, SimNode

APPS = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


def smi(node: SimNode, *args: str) -> str:
    out = subprocess.run([node.nvidia_smi, *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out
    return out.stdout


def used(node: SimNode, gpu: int) -> int:
    return int(
        smi(node, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(gpu))
    )


def listed(node: SimNode) -> dict[int, int]:
    rows = [line.split(", ") for line in smi(node, *APPS).splitlines()]
    return {int(p): int(m) for p, m in rows}


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    st = simstate.proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def wait_for(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    # Only ever waited on to become true: a long deadline costs nothing when the box is quick,
    # and a box with a load of 25 (the busy-machine runs) takes seconds to let a process die.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def fuser(*paths: str) -> dict[str, list[tuple[int, str, str]]]:
    """Return ``{path: [(pid, user, access)]}`` as ``fuser -v`` reports them."""
    # fuser -v writes the PIDs to stdout and the rest to stderr: read both from one pipe.
    out = subprocess.run(
        ["fuser", "-v", *paths],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=20,
    )
    table: dict[str, list[tuple[int, str, str]]] = {p: [] for p in paths}
    current = None
    for line in out.stdout.splitlines():
        if line.startswith("Cannot stat") or line.split()[:2] == ["USER", "PID"]:
            continue
        head, sep, rest = line.partition(":")
        if sep and head in table:
            current, line = head, rest
        fields = line.split()
        if current and len(fields) >= 4 and fields[1].isdigit():
            table[current].append((int(fields[1]), fields[0], fields[2]))
    return table


@pytest.fixture
def node(sim_fleet: SimFleet) -> Iterator[SimNode]:
    """node2 of the module's fleet, cleared before and after each test."""
    n = sim_fleet.node("node2")
    n.clear()
    n.release_delay_s = 0.5
    yield n
    n.clear()
    n.release_delay_s = 1.5


def test_normal_exits_on_sigterm_and_memory_is_released_after_the_delay(node: SimNode) -> None:
    # A delay long enough that the first look after the death comes before the release even on
    # a box with a load of 25; the checks below are on the state's own timestamps, not on speed.
    delay, node.release_delay_s = node.release_delay_s, 3.0
    try:
        w = node.spawn(gpu=0, mib=4096)
        assert listed(node) == {w.pid: 4096} and used(node, 0) == 4096
        killed_at = time.time()
        os.kill(w.pid, signal.SIGTERM)
        assert wait_for(lambda: not running(w.pid))
        assert wait_for(lambda: w.current_pid() is None)
        (a,) = node.state()["allocations"]
        assert killed_at <= a["died_at"] <= time.time()  # the driver saw the death
        assert listed(node) == {}  # a dead process is not listed ...
        seen: list[tuple[float, int, float]] = []
        while not seen or seen[-1][1]:
            before = time.time()
            seen.append((before, used(node, 0), time.time()))
            assert before < a["died_at"] + 30
        # ... but its memory lingers for the release delay, and not longer.
        release = a["died_at"] + 3.0
        assert a["released_at"] == pytest.approx(release)
        assert seen[0][2] < release and seen[0][1] == 4096
        assert all(mem == 4096 for _, mem, t1 in seen if t1 < release)  # answered before it
        assert all(mem == 0 for t0, mem, _ in seen if t0 > release)  # asked after it
    finally:
        node.release_delay_s = delay


def test_release_delay_is_settable(node: SimNode) -> None:
    node.release_delay_s = 0.0
    w = node.spawn(gpu=1, mib=100)
    os.kill(w.pid, signal.SIGKILL)
    assert wait_for(lambda: used(node, 1) == 0, 10)
    assert node.release_delay_s == 0.0


def test_stubborn_ignores_sigterm_and_dies_on_sigkill(node: SimNode) -> None:
    w = node.spawn(gpu=1, mib=2048, behaviour="stubborn")
    os.kill(w.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert running(w.pid) and listed(node) == {w.pid: 2048}
    os.kill(w.pid, signal.SIGKILL)
    assert wait_for(lambda: not running(w.pid))


def test_slow_exits_some_seconds_after_sigterm(node: SimNode) -> None:
    w = node.spawn(gpu=2, mib=1000, behaviour="slow", slow_exit_s=0.8)
    t0 = time.monotonic()
    os.kill(w.pid, signal.SIGTERM)
    time.sleep(0.4)
    if time.monotonic() - t0 < 0.7:  # (a loaded machine may wake this test later than that)
        assert running(w.pid)
    assert wait_for(lambda: not running(w.pid), 3)
    assert time.monotonic() - t0 >= 0.8


def test_respawn_supervisor_restarts_the_child_on_the_same_gpu(node: SimNode) -> None:
    w = node.spawn(gpu=3, mib=2048, behaviour="respawn")
    assert w.supervisor_pid is not None and w.supervisor_pid != w.pid
    assert simstate.proc_stat(w.pid)[1] == w.supervisor_pid  # type: ignore[index]
    # The supervisor holds no device file; its child holds the GPU's.
    sup_fds = [
        os.readlink(f"/proc/{w.supervisor_pid}/fd/{fd}")
        for fd in os.listdir(f"/proc/{w.supervisor_pid}/fd")
    ]
    assert not any(p.startswith(node.dev_prefix) for p in sup_fds)
    holders = fuser(node.device(3))[node.device(3)]
    assert [h[0] for h in holders] == [w.pid]
    os.kill(w.pid, signal.SIGTERM)
    assert wait_for(lambda: w.current_pid() not in (None, w.pid), 5)
    new = w.current_pid()
    assert new is not None and listed(node).get(new) == 2048
    assert simstate.proc_stat(new)[1] == w.supervisor_pid  # type: ignore[index]
    assert w.alive()
    os.kill(w.supervisor_pid, signal.SIGTERM)  # passed on to the child; nothing respawns
    assert wait_for(lambda: not running(new) and not running(w.supervisor_pid or 0), 5)
    time.sleep(0.5)
    assert w.current_pid() is None


def test_orphan_keeps_its_memory_unlisted_until_gpu_reset(node: SimNode) -> None:
    w = node.spawn(gpu=4, mib=8000, behaviour="orphan")
    assert listed(node) == {w.pid: 8000}
    os.kill(w.pid, signal.SIGTERM)
    assert wait_for(lambda: not running(w.pid))
    time.sleep(0.8)  # past the release delay
    assert listed(node) == {} and used(node, 4) == 8000
    (a,) = node.state()["allocations"]
    assert a["orphan"] and not a["alive"] and not a["released"]
    out = subprocess.run(
        [node.nvidia_smi, "--gpu-reset", "-i", "4"], capture_output=True, text=True
    )
    assert out.returncode == 0 and used(node, 4) == 0


def test_hidden_holds_memory_and_the_device_but_is_not_listed(node: SimNode) -> None:
    w = node.spawn(gpu=5, mib=3000, behaviour="hidden")
    assert listed(node) == {} and used(node, 5) == 3000
    assert [h[0] for h in fuser(node.device(5))[node.device(5)]] == [w.pid]
    busy = subprocess.run([node.nvidia_smi, "--gpu-reset", "-i", "5"], capture_output=True)
    assert busy.returncode == 255


def test_ctl_only_holds_the_control_files_only(node: SimNode) -> None:
    w = node.spawn(gpu=None, behaviour="ctl-only", name="nvidia-persistenced")
    ctl, uvm, gpu0 = node.dev_prefix + "ctl", node.dev_prefix + "-uvm", node.device(0)
    seen = fuser(ctl, uvm, gpu0)
    assert [h[0] for h in seen[ctl]] == [w.pid] and [h[0] for h in seen[uvm]] == [w.pid]
    assert seen[gpu0] == []
    assert seen[ctl][0][2] == "F...m"  # opened and mapped, like a CUDA context
    assert listed(node) == {} and all(g["memory_used_mib"] == 0 for g in node.state()["gpus"])


def test_process_name_is_comm_and_argv0(node: SimNode) -> None:
    w = node.spawn(gpu=6, mib=200, name="nvidia-persistenced")
    with open(f"/proc/{w.pid}/comm") as f:
        assert f.read().strip() == "nvidia-persiste"  # the kernel keeps 15 characters
    assert simstate.cmdline_name(w.pid) == "nvidia-persistenced"
    ps = subprocess.run(["ps", "-o", "comm=", "-p", str(w.pid)], capture_output=True, text=True)
    assert ps.stdout.strip() == "nvidia-persiste"
    rows = smi(node, "--query-compute-apps=pid,process_name", "--format=csv,noheader")
    assert rows == f"{w.pid}, nvidia-persistenced\n"


def test_workloads_of_other_users(node: SimNode, sim_users: tuple[str, ...]) -> None:
    alice, bob = sim_users
    a = node.spawn(gpu=7, mib=1000, user=alice)
    b = node.spawn(gpu=7, mib=2000, user=bob, behaviour="stubborn")
    for w, name in ((a, alice), (b, bob)):
        assert os.stat(f"/proc/{w.pid}").st_uid == pwd.getpwnam(name).pw_uid
        assert w.user == name
    assert used(node, 7) == 3000
    users = {h[1] for h in fuser(node.device(7))[node.device(7)]}
    assert users == {alice, bob}
    os.kill(a.pid, signal.SIGTERM)
    os.kill(b.pid, signal.SIGKILL)
    assert wait_for(lambda: not running(a.pid) and not running(b.pid))


def test_a_zombie_counts_as_dead(node: SimNode) -> None:
    w = node.spawn(gpu=0, mib=500, behaviour="respawn")
    assert w.supervisor_pid is not None
    os.kill(w.supervisor_pid, signal.SIGSTOP)  # a stopped parent cannot reap its child
    try:
        # SIGSTOP lands when the supervisor next runs; on a loaded box its wait() may first
        # reap a child that died meanwhile. Kill the child only once the parent is stopped.
        sup = w.supervisor_pid
        assert wait_for(lambda: (simstate.proc_stat(sup) or ("?",))[0] in ("T", "t"))
        os.kill(w.pid, signal.SIGKILL)
        assert wait_for(lambda: (simstate.proc_stat(w.pid) or ("?",))[0] == "Z")
        assert wait_for(lambda: w.current_pid() is None)
        assert listed(node) == {}
    finally:
        os.kill(w.supervisor_pid, signal.SIGCONT)
    assert wait_for(lambda: w.current_pid() not in (None, w.pid))  # reaped and respawned


def test_a_reused_pid_does_not_keep_an_allocation_alive(node: SimNode) -> None:
    # A record whose pid now belongs to another process (other start time) is dead.
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        ticks = simstate.start_ticks(sleeper.pid)
        assert ticks is not None
        with simstate.transaction(str(node.state_dir)) as st:
            st["allocs"].append(
                {
                    "pid": sleeper.pid,
                    "start_ticks": ticks - 1,
                    "gpu": 1,
                    "mib": 777,
                    "util": 10,
                    "behaviour": "normal",
                    "name": "x",
                    "user": "root",
                    "died_at": None,
                }
            )
        assert listed(node) == {}
        (a,) = node.state()["allocations"]
        assert not a["alive"] and a["died_at"] is not None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_bad_spawn_arguments_are_usage_errors(node: SimNode) -> None:
    from gpusim.errors import SimUsageError

    for kwargs in (
        {"gpu": 8},
        {"gpu": -1},
        {"gpu": None},
        {"gpu": 0, "behaviour": "lazy"},
        {"gpu": 0, "mib": 10**7},
        {"gpu": 0, "user": "gpusim-nobody-here"},
        {"gpu": 0, "name": "a/b"},
    ):
        with pytest.raises(SimUsageError):
            node.spawn(**kwargs)
    assert node.live_pids() == []


def test_stop_kills_exactly_what_the_fleet_started(
    fleet_factory: Callable[..., SimFleet],
) -> None:
    bystander = subprocess.Popen(["sleep", "30"])  # not the fleet's: must survive
    try:
        fleet = fleet_factory(nodes=1, gpus=4, release_delay_s=0.1)
        n = fleet.node("node1")
        ws = [
            n.spawn(gpu=i % 4, behaviour=b)
            for i, b in enumerate(
                ["normal", "stubborn", "slow", "respawn", "orphan", "hidden", "ctl-only"]
            )
        ]
        procs = [(w.pid, w.start_ticks) for w in ws] + [
            (w.supervisor_pid, w.supervisor_start_ticks)
            for w in ws
            if w.supervisor_pid and w.supervisor_start_ticks
        ]
        n.set_fault("hang")
        hung = subprocess.Popen([n.nvidia_smi, "-L"], stdout=subprocess.PIPE)
        assert wait_for(lambda: bool(n.hung_smi()))
        fleet.stop()
        fleet.stop()  # idempotent
        # Dead and reaped (no zombie left): the pid no longer names the process.
        assert all(simstate.start_ticks(p) != t for p, t in procs)
        assert hung.wait(5) == -signal.SIGKILL
        assert hung.stdout is not None
        hung.stdout.close()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
