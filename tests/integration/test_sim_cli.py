"""``gpubot sim up|spawn|fault|state|down`` as a person types them: a real daemon, real SSH."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.config import load
from gpusim import simstate
from gpusim.control import MAX_SOCKET_PATH, socket_path

ROOT = Path(__file__).resolve().parents[2]


def gpubot(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def in_process(
    capsys: pytest.CaptureFixture[str], *args: str | Path
) -> subprocess.CompletedProcess[str]:
    """Run ``gpubot`` in this process (the same code path, without a new interpreter)."""
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess([str(a) for a in args], rc, out.out, out.err)


def running(pid: int) -> bool:
    st = simstate.proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


@dataclass
class Daemon:
    dir: Path
    config: Path
    pid: int


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("sim-cli")
    up = gpubot("sim", "up", "--dir", d, "--nodes", "2", "--gpus", "2", "--release-delay", "0.2")
    assert up.returncode == 0, up.stderr
    pid = int((d / "sim.pid").read_text().split()[0])
    try:
        yield Daemon(d, Path(up.stdout.strip()), pid)
    finally:
        if running(pid):
            down = gpubot("sim", "down", "--dir", d)
            assert down.returncode == 0, down.stderr


def one_line_error(out: subprocess.CompletedProcess[str], text: str) -> None:
    assert out.returncode != 0
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("gpubot: error: ") and text in out.stderr, out.stderr


def test_up_prints_the_inventory_path(daemon: Daemon) -> None:
    assert daemon.config == daemon.dir / "gpubot.toml"
    settings = load(daemon.config)
    assert [n.name for n in settings.nodes] == ["node1", "node2"]
    assert running(daemon.pid)
    again = gpubot("sim", "up", "--dir", daemon.dir)
    one_line_error(again, f"already runs in {daemon.dir} (pid {daemon.pid})")


def test_spawn_fault_state_through_the_daemon(daemon: Daemon) -> None:
    out = gpubot(
        "sim",
        "spawn",
        "--dir",
        daemon.dir,
        "--node",
        "node2",
        "--gpu",
        "1",
        "--mib",
        "2500",
        "--behaviour",
        "stubborn",
        "--name",
        "trainer",
    )
    assert out.returncode == 0, out.stderr
    w = json.loads(out.stdout)
    assert (w["node"], w["gpu"], w["mib"], w["behaviour"], w["name"]) == (
        "node2",
        1,
        2500,
        "stubborn",
        "trainer",
    )
    assert simstate.proc_stat(w["pid"])[1] == daemon.pid  # type: ignore[index]  # its child
    fault = gpubot(
        "sim", "fault", "--dir", daemon.dir, "--node", "node2", "slow", "--delay-s", "0.3"
    )
    assert json.loads(fault.stdout) == {"kind": "slow", "delay_s": 0.3}
    state = json.loads(gpubot("sim", "state", "--dir", daemon.dir, "--node", "node2").stdout)
    (node2,) = state
    assert node2["fault"]["kind"] == "slow"
    assert node2["gpus"][1]["memory_used_mib"] == 2500
    (a,) = node2["allocations"]
    assert a["pid"] == w["pid"] and a["alive"]
    # The rest of gpubot sees it through a real OpenSSH client.
    s = load(daemon.config)
    cfg = s.node("node2")
    assert cfg is not None and cfg.key is not None
    ssh = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        cfg.key,
        "-p",
        str(cfg.port),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={s.ssh.known_hosts}",
        f"{cfg.user}@127.0.0.1",
        cfg.nvidia_smi,
        "--query-compute-apps=pid,process_name",
        "--format=csv,noheader",
    ]
    remote = subprocess.run(ssh, capture_output=True, text=True, timeout=30)
    assert remote.stdout == f"{w['pid']}, trainer\n", remote.stderr
    os.kill(w["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while simstate.proc_stat(w["pid"]) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert simstate.proc_stat(w["pid"]) is None  # the daemon reaped it
    gpubot("sim", "fault", "--dir", daemon.dir, "--node", "node2", "none")


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["spawn", "--node", "node9", "--gpu", "0"], "unknown node 'node9' (nodes: node1, node2)"),
        (["spawn", "--node", "node1", "--gpu", "2"], "node1: no GPU 2 (this node has GPUs 0-1)"),
        (["spawn", "--node", "node1", "--gpu", "0", "--user", "gpusim-nobody"], "no such user"),
        (["fault", "--node", "node3", "hang"], "unknown node 'node3'"),
        (["fault", "--node", "node1", "hang", "--delay-s", "2"], "--delay-s goes with"),
        (["state", "--node", "nodeX"], "unknown node 'nodeX'"),
        (["xid", "--node", "node1", "--gpu", "5", "79"], "node1 has no GPU 5"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(
    daemon: Daemon, args: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(in_process(capsys, "sim", args[0], "--dir", daemon.dir, *args[1:]), text)


def test_an_xid_line_through_the_daemon(daemon: Daemon) -> None:
    out = gpubot("sim", "xid", "--dir", daemon.dir, "--node", "node1", "--gpu", "1", "79")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == "NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus."


def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = gpubot("sim", "up", "--dir", tmp_path, "--nodes", "1", "--port", str(port))
    one_line_error(out, f"port {port} on 127.0.0.1 is in use")
    assert not (tmp_path / "sim.pid").exists()


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["up", "--nodes", "0"], "nodes must be 1-64"),
        (["up", "--gpus", "65"], "gpus must be 1-64"),
        (["up", "--release-delay", "-1"], "release delay must be >= 0"),
        (["down"], "no simulated fleet runs in"),
        (["spawn", "--node", "node1", "--gpu", "0"], "no simulated fleet runs in"),
    ],
)
def test_bad_input_without_a_fleet(
    tmp_path: Path, args: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(in_process(capsys, "sim", args[0], "--dir", tmp_path, *args[1:]), text)


def test_down_stops_the_daemon_and_its_workloads(tmp_path: Path) -> None:
    up = gpubot("sim", "up", "--dir", tmp_path, "--nodes", "1", "--gpus", "1", "--server", "sshd")
    assert up.returncode == 0, up.stderr
    pid = int((tmp_path / "sim.pid").read_text().split()[0])
    spawn = gpubot(
        "sim", "spawn", "--dir", tmp_path, "--node", "node1", "--gpu", "0", "--behaviour", "respawn"
    )
    w = json.loads(spawn.stdout)
    assert running(w["pid"]) and running(w["supervisor_pid"])
    down = gpubot("sim", "down", "--dir", tmp_path)
    assert down.returncode == 0 and down.stdout.startswith("stopped the simulated fleet")
    assert not running(pid) and not running(w["pid"]) and not running(w["supervisor_pid"])
    assert not (tmp_path / "sim.pid").exists()


def test_a_long_directory_gets_a_short_control_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = socket_path(deep)
    assert len(str(path)) <= MAX_SOCKET_PATH and path == socket_path(deep)
    assert socket_path(tmp_path) == tmp_path / "control.sock"


@pytest.mark.parametrize("reads", [True, False], ids=["after-the-request", "at-once"])
def test_a_fleet_failure_is_one_line_too(
    tmp_path: Path, reads: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``gpusim.errors.SimError`` that is no usage error (here: a control socket that hangs
    up without an answer, after reading the request or at once) is a one-line error too."""
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(socket_path(tmp_path)))
        srv.listen()

        def hang_up() -> None:
            conn, _ = srv.accept()
            if reads:
                conn.makefile("rb").readline()
            conn.close()

        t = threading.Thread(target=hang_up, daemon=True)
        t.start()
        out = in_process(capsys, "sim", "state", "--dir", tmp_path)
        t.join(5)
    one_line_error(out, f"the fleet in {tmp_path} ")
    if reads:
        assert "closed the connection without an answer" in out.stderr


def test_python_m_gpusim_is_the_same_command_without_gpubot(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpusim", "up", "--dir", str(tmp_path), "--nodes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == "gpusim: error: nodes must be 1-64, not 0\n"
