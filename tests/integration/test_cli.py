"""The ``gpubot`` command line, run as a real subprocess against the simulated fleet."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusim.fleet import SimFleet, SimNode


class Fleet:
    """The simulated fleet and a settings file with short reset deadlines."""

    def __init__(self, sim: SimFleet) -> None:
        self.sim = sim
        self.config_path = sim.config_path.with_name("cli.toml")
        text = sim.config_path.read_text()
        self.config_path.write_text(
            text + "\n[reset]\nverify_timeout_s = 3\npoll_interval_s = 0.1\n"
        )

    def node(self, name: str) -> SimNode:
        return self.sim.node(name)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with SimFleet(tmp_path_factory.mktemp("cli"), nodes=3, gpus=4, release_delay_s=0.3) as f:
        fl = Fleet(f)
        subprocess.run(
            [sys.executable, "-m", "gpubot", "--config", str(fl.config_path), "db", "upgrade"],
            check=True,
            capture_output=True,
        )
        yield fl


def gpubot(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=60,
    )


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpubot")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_status_all_answered(fleet: Fleet) -> None:
    w = fleet.node("node2").spawn(gpu=3, mib=1234)
    try:
        p = gpubot(fleet.config_path, "status")
        assert p.returncode == 0, p.stderr
        assert "3/3 nodes answered" in p.stdout
        assert f" {w.pid} 1234 MiB " in p.stdout
        assert "\033[" not in p.stdout  # no colour off a TTY
        assert max(len(line) for line in p.stdout.splitlines()) <= 110
    finally:
        os.kill(w.pid, signal.SIGKILL)


def test_status_json_document(fleet: Fleet) -> None:
    w = fleet.node("node1").spawn(gpu=0, mib=2048)
    try:
        p = gpubot(fleet.config_path, "status", "node1", "--json")
        assert p.returncode == 0, p.stderr
        (node,) = json.loads(p.stdout)["nodes"]
        assert {"name", "ok", "error", "gpus"} <= node.keys() and node["ok"] is True
        gpu0 = node["gpus"][0]
        assert {
            "index",
            "uuid",
            "name",
            "memory_used_mib",
            "memory_total_mib",
            "utilization_pct",
            "processes",
        } <= gpu0.keys()
        (proc,) = gpu0["processes"]
        assert {
            "pid",
            "user",
            "ppid",
            "state",
            "start_ticks",
            "used_memory_mib",
            "process_name",
            "command",
            "visible_to_nvidia_smi",
        } <= proc.keys()
        assert proc["pid"] == w.pid and proc["start_ticks"] == w.start_ticks
    finally:
        os.kill(w.pid, signal.SIGKILL)


def test_status_exits_1_when_a_node_fails(fleet: Fleet) -> None:
    fleet.node("node3").set_fault("driver-error")
    try:
        p = gpubot(fleet.config_path, "status", "--json")
        assert p.returncode == 1
        nodes = {n["name"]: n for n in json.loads(p.stdout)["nodes"]}
        assert nodes["node3"]["ok"] is False and "NVIDIA driver" in nodes["node3"]["error"]
        assert nodes["node1"]["ok"] is True
    finally:
        fleet.node("node3").set_fault(None)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("status", "nodeX"), "unknown node or group 'nodeX'"),
        (("reset", "nodeX", "--yes"), "unknown node 'nodeX'"),
        (("reset", "node1", "--gpu", "9", "--yes"), "node1 has no GPU 9"),
        (("reset", "node1", "--gpu", "-1"), "must be >= 0"),
        (("reset", "node1", "--grace", "soon"), "bad grace 'soon'"),
        (("gpu-reset", "node1"), "--gpu"),
    ],
)
def test_bad_input_is_one_line(fleet: Fleet, args: tuple[str, ...], words: str) -> None:
    assert words in one_line_error(gpubot(fleet.config_path, *args))


def test_bad_config_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text('[[nodes]]\nname = "n1"\nhost = "h"\nport = 99999\n')
    line = one_line_error(gpubot(cfg, "status"))
    assert str(cfg) in line and "nodes[0].port" in line


def test_dry_run_changes_nothing(fleet: Fleet) -> None:
    w = fleet.node("node1").spawn(gpu=2, mib=512)
    try:
        p = gpubot(fleet.config_path, "reset", "node1", "--gpu", "2", "--dry-run", "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert [t["pid"] for t in doc["plan"]["targets"]] == [w.pid] and doc["steps"] == []
        assert os.path.exists(f"/proc/{w.pid}")
    finally:
        os.kill(w.pid, signal.SIGKILL)


def test_reset_refuses_without_yes_off_a_tty(fleet: Fleet) -> None:
    w = fleet.node("node1").spawn(gpu=2, mib=512)
    try:
        p = gpubot(fleet.config_path, "reset", "node1", "--gpu", "2", stdin="y\n")
        assert "add --yes" in one_line_error(p)
        assert os.path.exists(f"/proc/{w.pid}")
    finally:
        os.kill(w.pid, signal.SIGKILL)


def test_forced_reset_needs_force(fleet: Fleet, sim_users: tuple[str, ...]) -> None:
    w = fleet.node("node1").spawn(gpu=1, mib=512, user=sim_users[1])
    try:
        p = gpubot(fleet.config_path, "reset", "node1", "--gpu", "1", "--yes")
        assert f"kills processes of {sim_users[1]}" in one_line_error(p)
        p = gpubot(fleet.config_path, "reset", "node1", "--gpu", "1", "--yes", "--force", "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["plan"]["forced"] is True
        assert [(g["index"], g["outcome"]) for g in doc["gpus"]] == [(1, "freed")]
        assert {"memory_before_mib", "memory_after_mib", "seconds_to_free"} <= doc["gpus"][0].keys()
    finally:
        if os.path.exists(f"/proc/{w.pid}"):
            os.kill(w.pid, signal.SIGKILL)


def test_reset_exit_status_follows_the_outcome(fleet: Fleet) -> None:
    fleet.node("node2").spawn(gpu=0, mib=3000, behaviour="orphan")
    p = gpubot(fleet.config_path, "reset", "node2", "--gpu", "0", "--yes", "--grace", "1")
    assert p.returncode == 1 and "orphaned" in p.stdout
    p = gpubot(fleet.config_path, "gpu-reset", "node2", "--gpu", "0", "--yes")
    assert p.returncode == 0 and "freed" in p.stdout
    p = gpubot(fleet.config_path, "audit", "verify")
    assert p.returncode == 0, p.stdout + p.stderr
    # The audit log records each command as typed, --config included.
    p = gpubot(fleet.config_path, "audit", "list", "--json")
    commands = [a["command"] for a in json.loads(p.stdout)]
    cfg = shlex.quote(str(fleet.config_path))
    assert f"gpubot --config {cfg} reset node2 --gpu 0 --yes --grace 1" in commands
    assert f"gpubot --config {cfg} gpu-reset node2 --gpu 0 --yes" in commands
