"""Hostile workloads of the simulated fleet: forged argv and comm, token hunting, daemon exes."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from gpusim import simstate
from gpusim.errors import SimUsageError
from gpusim.fleet import SimFleet, SimNode

HEX = "0123456789abcdef"
APPS = ("--query-compute-apps=pid,process_name", "--format=csv,noheader")


@pytest.fixture
def node(fleet_factory: Callable[..., SimFleet]) -> SimNode:
    """The only node of a fresh 1 x 4 fleet (its workloads die with the fleet)."""
    return fleet_factory(nodes=1, gpus=4, release_delay_s=0.1).node("node1")


@pytest.fixture(params=["self", "alice"])
def user(request: pytest.FixtureRequest) -> str | None:
    """Run as the test's own user, then as an unprivileged one (root only)."""
    if request.param == "self":
        return None
    users: tuple[str, ...] = request.getfixturevalue("sim_users")
    return users[0]


@pytest.fixture
def secret_holder() -> Iterator[Callable[[], str]]:
    """Start processes with a fresh hex token in argv (as gpubot's remote calls have one)."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        token = secrets.token_hex(12)
        started.append(
            subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)", token])
        )
        return token

    yield start
    for p in started:
        p.kill()  # by pid: Popen signals exactly the process it started
        p.wait()


def smi(node: SimNode, *args: str) -> str:
    out = subprocess.run([node.nvidia_smi, *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out
    return out.stdout


def cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm", "rb") as f:
        return f.read().decode()


def running(pid: int) -> bool:
    st = simstate.proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0, step_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step_s)
    return cond()


def test_forger_shows_its_payload_in_argv_comm_and_nvidia_smi(
    node: SimNode, user: str | None
) -> None:
    w = node.spawn(gpu=0, mib=512, user=user, name="python3", forge="evil\n{pid}, 1 MiB")
    payload = f"evil\n{w.pid}, 1 MiB"
    assert wait_for(lambda: cmdline(w.pid).startswith(payload.encode() + b"\0"), 10.0)
    # The whole argv area is the payload and NULs: no trace of the real arguments is left.
    assert cmdline(w.pid).rstrip(b"\0") == payload.encode()
    assert comm(w.pid) == payload[:15] + "\n"  # newline included; the kernel keeps 15 bytes
    assert simstate.cmdline_name(w.pid) == payload
    # Like the real tool, the stand-in prints the name unescaped: the row spills over lines.
    assert smi(node, *APPS) == f"{w.pid}, {payload}\n"
    # Otherwise a normal workload: same record, same GPU, and it exits on SIGTERM.
    (a,) = node.state()["allocations"]
    assert (a["pid"], a["gpu"], a["mib"], a["name"]) == (w.pid, 0, 512, "python3")
    os.kill(w.pid, signal.SIGTERM)
    assert wait_for(lambda: not running(w.pid))


def test_forger_copies_a_token_from_another_process_argv(
    node: SimNode, user: str | None, secret_holder: Callable[[], str]
) -> None:
    w = node.spawn(gpu=1, user=user, forge="gpubot-probe --nonce {token}\n{pid}")
    # The box may already run processes with hex tokens in argv (CI runners do): the forger
    # shows one of those or the literal {token}; either way it is forging before ours exists.
    assert wait_for(lambda: cmdline(w.pid).startswith(b"gpubot-probe --nonce "), 10.0)
    token = secret_holder()
    # Other processes may bring newer tokens at any time: any moment that shows ours counts.
    want = f"gpubot-probe --nonce {token}\n{w.pid}\0".encode()
    assert wait_for(lambda: cmdline(w.pid).startswith(want), 2.0, step_s=0.001)


def test_forge_text_with_nuls_makes_several_args(node: SimNode) -> None:
    w = node.spawn(gpu=2, forge="python3\0train.py\0--epochs=90")
    assert wait_for(lambda: cmdline(w.pid).startswith(b"python3\0train.py\0--epochs=90\0"), 10.0)
    assert cmdline(w.pid).rstrip(b"\0") == b"python3\0train.py\0--epochs=90"
    assert comm(w.pid) == "python3\n"
    assert smi(node, *APPS) == f"{w.pid}, python3\n"


def test_long_forge_text_is_cut_to_the_argv_area(node: SimNode) -> None:
    w = node.spawn(gpu=3, forge="A" * 2000)
    assert wait_for(lambda: cmdline(w.pid).startswith(b"A" * 2000 + b"\0"), 10.0)
    area = len(cmdline(w.pid))
    w2 = node.spawn(gpu=3, forge="{token}" * 280)  # a 64-byte token each would overflow it
    # Forging shows "{token}..." or, where some process on the box has a hex token in its
    # argv, that token: either way no longer the interpreter's path that the real argv starts with.
    assert wait_for(lambda: cmdline(w2.pid)[:1] in (b"{", *(c.encode() for c in HEX)), 10.0)
    assert len(cmdline(w2.pid)) <= area + 7 * 280 and cmdline(w2.pid).endswith(b"\0")
    with pytest.raises(SimUsageError):
        node.spawn(gpu=3, forge="A" * 2001)


@pytest.mark.parametrize("behaviour", ["slow", "stubborn"])
def test_forger_keeps_its_behaviour(node: SimNode, behaviour: str) -> None:
    w = node.spawn(gpu=0, behaviour=behaviour, slow_exit_s=0.3, forge="kworker/0:1")
    assert wait_for(lambda: comm(w.pid) == "kworker/0:1\n", 10.0)
    t0 = time.monotonic()
    os.kill(w.pid, signal.SIGTERM)  # the forger thread blocks signals: the main thread gets it
    if behaviour == "slow":
        time.sleep(0.1)
        if time.monotonic() - t0 < 0.25:  # (a loaded machine may wake this test later)
            assert running(w.pid)
        assert wait_for(lambda: not running(w.pid), 3.0)
    else:
        time.sleep(0.3)
        assert running(w.pid)
        os.kill(w.pid, signal.SIGKILL)
        assert wait_for(lambda: not running(w.pid))


def test_respawned_children_forge_too(node: SimNode) -> None:
    w = node.spawn(gpu=1, behaviour="respawn", forge="child {pid}")
    assert wait_for(lambda: cmdline(w.pid).startswith(f"child {w.pid}\0".encode()), 10.0)
    assert w.supervisor_pid is not None and not cmdline(w.supervisor_pid).startswith(b"child")
    os.kill(w.pid, signal.SIGKILL)
    assert wait_for(lambda: w.current_pid() not in (None, w.pid), 5.0)
    new = w.current_pid()
    assert new is not None
    assert wait_for(lambda: cmdline(new).startswith(f"child {new}\0".encode()), 10.0)
    os.kill(w.supervisor_pid, signal.SIGTERM)
    assert wait_for(lambda: not running(new) and not running(w.supervisor_pid or 0), 5.0)


def test_daemon_exe_is_a_real_executable_of_its_own(node: SimNode, user: str | None) -> None:
    exe = node.daemon_exe("nvidia-persistenced")
    assert exe == os.path.join(os.path.realpath(node.dir), "sbin", "nvidia-persistenced")
    assert not os.path.islink(exe) and os.stat(exe).st_mode & 0o777 == 0o755
    assert node.daemon_exe("nvidia-persistenced") == exe  # made once
    w = node.spawn(gpu=2, mib=300, user=user, name="nvidia-persistenced", exe_path=exe)
    assert os.readlink(f"/proc/{w.pid}/exe") == exe
    assert comm(w.pid) == "nvidia-persiste\n"  # the kernel keeps 15 characters
    assert smi(node, *APPS) == f"{w.pid}, nvidia-persistenced\n"
    assert [a["pid"] for a in node.state()["allocations"] if a["alive"]] == [w.pid]


def test_daemon_exe_can_forge_too(node: SimNode) -> None:
    exe = node.daemon_exe("nvidia-persistenced")
    w = node.spawn(gpu=3, exe_path=exe, forge="/usr/bin/nvidia-persistenced --user nvpd")
    assert wait_for(lambda: cmdline(w.pid).startswith(b"/usr/bin/nvidia-persistenced --"), 10.0)
    assert os.readlink(f"/proc/{w.pid}/exe") == exe
    assert comm(w.pid) == "/usr/bin/nvidia\n"


def test_exe_path_must_be_inside_the_node_directory(node: SimNode, tmp_path: object) -> None:
    for bad in ("/usr/bin/python3", f"{node.dir}/../elsewhere", str(node.dir)):
        with pytest.raises(SimUsageError):
            node.spawn(gpu=0, exe_path=bad)
    for name in ("", "a/b", "..", "x\0y"):
        with pytest.raises(SimUsageError):
            node.daemon_exe(name)
    inside = os.path.join(node.dir, "nvidia-fabricmanager")
    w = node.spawn(gpu=0, exe_path=inside)  # made on first use, like daemon_exe
    assert os.readlink(f"/proc/{w.pid}/exe") == os.path.realpath(inside)
