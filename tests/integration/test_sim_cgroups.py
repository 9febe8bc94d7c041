"""Simulated workloads in real cgroups, and the node's stand-in docker, podman, crictl, scontrol,
scancel and systemctl, answered over the node's real SSH server.

Each workload's ``/proc/PID/cgroup`` is read from the kernel and parsed by the core's own
``parse_cgroup``; every stop kills real processes, found through their cgroup.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.cli import main
from gpubot.config import load
from gpubot.core.workload import parse_cgroup
from gpusim import simstate
from gpusim.cgroups import CgroupSet, Hierarchies, find_hierarchies
from gpusim.errors import SimUsageError
from gpusim.fleet import SimFleet, SimNode, Workload
from gpusim.server import STD_PATH
from gpusim.server_sshd import SSHD
from gpusim.sudo import PASSWORD_REQUIRED
from gpusim.sudoers import readme_sudo_rule

README = Path(__file__).resolve().parents[2] / "README.md"
ROOT = Path(__file__).resolve().parents[2]
KINDS = ("docker", "podman", "kubernetes", "slurm", "service", "session")


@pytest.fixture(scope="module")
def fleet(cgroups_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("cgroups"), nodes=1, gpus=4, runtimes=True, release_delay_s=0.2
    ) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.clear()  # kills what the test left, removes its cgroups, empties the registry


def ssh(node: SimNode, *remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(node.ssh_argv(*remote), capture_output=True, text=True, timeout=60)


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def v2_line(pid: int) -> str:
    (line,) = [ln for ln in cgroup_of(pid).splitlines() if ln.startswith("0::")]
    return line[3:]


def wait_for(cond: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---- the cgroups ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_workload_reads_as_its_kind_and_id(node: SimNode, kind: str) -> None:
    w = node.spawn(gpu=0, mib=512, cgroup=kind)
    text = cgroup_of(w.pid)
    assert w.cgroup_kind == kind and w.cgroup_path is not None
    assert f"0::{w.cgroup_path}" in text.splitlines()
    found = parse_cgroup(text)
    assert found is not None and found.kind == kind
    want = {"slurm": w.job_id, "service": w.unit, "session": w.unit}.get(kind, w.container_id)
    assert found.id == want
    if kind == "kubernetes":
        assert found.get("pod_uid") == w.pod_uid and found.get("runtime") == "containerd"
    if kind == "session":
        assert found.get("uid") == str(os.geteuid())
    v1 = [ln for ln in text.splitlines() if ":name=systemd:" in ln]
    if v1:  # a hybrid box: the v1 name=systemd hierarchy has the shape too (Slurm: its v1 one)
        assert v1[0].endswith(f":{w.cgroup_v1_path}")
        alone = parse_cgroup(v1[0])  # what a v1-only box would show
        assert alone is not None and (alone.kind, alone.id) == (found.kind, found.id)
    if kind == "slurm":
        assert w.cgroup_v1_path == f"/slurm/uid_{os.geteuid()}/job_{w.job_id}/step_0"
        assert w.cgroup_path == f"/system.slice/slurmstepd.scope/job_{w.job_id}/step_0/user/task_0"


def test_ids_are_fresh_for_each_workload(node: SimNode) -> None:
    a, b = (node.spawn(gpu=1, mib=256, cgroup="docker") for _ in range(2))
    assert a.container_id != b.container_id and len(str(a.container_id)) == 64
    assert v2_line(a.pid) != v2_line(b.pid)


def test_a_slurm_job_runs_as_its_user(node: SimNode, sim_users: tuple[str, ...]) -> None:
    alice = sim_users[0]
    w = node.spawn(gpu=0, mib=256, cgroup="slurm", job_user=alice, job_name="sweep lr")
    pw = pwd.getpwnam(alice)
    assert os.stat(f"/proc/{w.pid}").st_uid == pw.pw_uid  # the job's process is the user's
    assert w.user == alice and w.job_user == alice
    assert w.cgroup_v1_path == f"/slurm/uid_{pw.pw_uid}/job_{w.job_id}/step_0"
    out = ssh(node, "scontrol", "show", "job", str(w.job_id))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"JobId={w.job_id} JobName=sweep lr"
    group = grp.getgrgid(pw.pw_gid).gr_name
    assert lines[1] == f"   UserId={alice}({pw.pw_uid}) GroupId={group}({pw.pw_gid}) MCS_label=N/A"


def test_respawned_children_stay_in_the_container(node: SimNode) -> None:
    w = node.spawn(gpu=2, mib=1024, cgroup="docker", container_name="trainer", restart="always")
    assert w.behaviour == "respawn" and w.supervisor_pid is not None
    assert v2_line(w.supervisor_pid) == v2_line(w.pid) == w.cgroup_path
    os.kill(w.pid, signal.SIGKILL)  # the fleet's child; the restart policy brings it back
    assert wait_for(lambda: w.current_pid() not in (None, w.pid))
    child = w.current_pid()
    assert child is not None and v2_line(child) == w.cgroup_path
    doc = json.loads(ssh(node, "docker", "inspect", "trainer").stdout)[0]
    assert (doc["State"]["Pid"], doc["RestartCount"]) == (child, 1)


# ---- docker --------------------------------------------------------------------------------------


def test_docker_inspect_answers_in_dockers_format(node: SimNode) -> None:
    labels = {"owner": "bob", "team": "<ml>"}
    w = node.spawn(
        gpu=0,
        mib=2048,
        cgroup="docker",
        container_name="train-llama",
        image="pytorch/pytorch:2.3",
        labels=labels,
    )
    for ref in (str(w.container_id), str(w.container_id)[:12], "train-llama", "/train-llama"):
        out = ssh(node, "docker", "inspect", ref)
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        assert out.stdout.startswith('[\n    {\n        "Id": ')
        assert "\\u003cml\\u003e" in out.stdout  # Go's encoder escapes <, > and &
        (doc,) = json.loads(out.stdout)
        assert doc["Id"] == w.container_id and doc["Name"] == "/train-llama"
        assert doc["Config"]["Image"] == "pytorch/pytorch:2.3"
        assert doc["Config"]["Labels"] == {"owner": "bob", "team": "<ml>"}
        assert doc["HostConfig"]["RestartPolicy"] == {"Name": "no", "MaximumRetryCount": 0}
        state = doc["State"]
        assert (state["Status"], state["Running"], state["Pid"]) == ("running", True, w.pid)


def test_docker_inspect_of_unknown_ids(node: SimNode) -> None:
    w = node.spawn(gpu=0, mib=256, cgroup="docker", container_name="known")
    out = ssh(node, "docker", "inspect", "nosuch")
    assert (out.returncode, out.stdout, out.stderr) == (
        1,
        "[]\n",
        "Error: No such object: nosuch\n",
    )
    out = ssh(node, "docker", "inspect", "known", "ghost", "deadbeef")
    assert out.returncode == 1
    assert [d["Id"] for d in json.loads(out.stdout)] == [w.container_id]  # what it found
    assert out.stderr == "Error: No such object: ghost\nError: No such object: deadbeef\n"


def test_docker_stop_ends_a_restarting_container_for_good(node: SimNode) -> None:
    w = node.spawn(gpu=1, mib=1024, cgroup="docker", container_name="sweeper", restart="always")
    sup, child = w.supervisor_pid, w.pid
    assert sup is not None
    out = ssh(node, "docker", "stop", "sweeper")
    assert (out.returncode, out.stdout, out.stderr) == (0, "sweeper\n", "")
    assert not w.alive() and not simstate.is_alive(child, w.start_ticks)
    time.sleep(1.0)  # longer than the respawn delay: nothing comes back
    assert w.current_pid() is None
    assert not [a for a in node.state()["allocations"] if a["alive"] and a["gpu"] == 1]
    (doc,) = json.loads(ssh(node, "docker", "inspect", str(w.container_id)).stdout)
    state = doc["State"]
    assert (state["Status"], state["Running"], state["Pid"], state["ExitCode"]) == (
        "exited",
        False,
        0,
        143,
    )
    assert state["FinishedAt"] != "0001-01-01T00:00:00Z"
    out = ssh(node, "docker", "stop", "nosuch")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "Error response from daemon: No such container: nosuch\n"


# ---- podman --------------------------------------------------------------------------------------


def test_podman_inspect_and_stop(node: SimNode) -> None:
    w = node.spawn(
        gpu=0,
        mib=256,
        cgroup="podman",
        container_name="jupyter",
        image="quay.io/jupyter/pytorch-notebook",
        labels={"a": "b&c"},
    )
    out = ssh(node, "podman", "inspect", "jupyter")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('[\n     {\n          "Id": ') and "b&c" in out.stdout
    (doc,) = json.loads(out.stdout)
    assert (doc["Id"], doc["Name"], doc["ImageName"]) == (
        w.container_id,
        "jupyter",
        "quay.io/jupyter/pytorch-notebook",
    )
    assert doc["Config"]["Labels"] == {"a": "b&c"} and doc["State"]["Pid"] == w.pid
    assert doc["State"]["CgroupPath"] == w.cgroup_path
    assert doc["HostConfig"]["RestartPolicy"]["Name"] == "no"
    out = ssh(node, "podman", "inspect", "jupyter", "x1", "x2")
    assert out.returncode == 125 and len(json.loads(out.stdout)) == 1
    assert out.stderr == (
        'error inspecting object: no such object: "x2"\n'
        'Error: inspecting object: no such object: "x1"\n'
    )
    out = ssh(node, "podman", "stop", str(w.container_id))
    assert (out.returncode, out.stdout) == (0, f"{w.container_id}\n")
    assert not w.alive()
    out = ssh(node, "podman", "stop", "x1")
    assert out.returncode == 125
    assert out.stderr == 'Error: no container with name or ID "x1" found: no such container\n'


# ---- crictl --------------------------------------------------------------------------------------


def test_crictl_inspect_one_several_and_unknown(node: SimNode) -> None:
    a = node.spawn(
        gpu=0,
        mib=256,
        cgroup="kubernetes",
        pod="ml/trainer-0",
        container_name="train",
        labels={"app": "llm"},
    )
    b = node.spawn(gpu=1, mib=256, cgroup="kubernetes")
    out = ssh(node, "crictl", "inspect", str(a.container_id)[:13])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('{\n  "info": {')
    doc = json.loads(out.stdout)
    status = doc["status"]
    assert status["id"] == a.container_id and status["metadata"]["name"] == "train"
    assert status["state"] == "CONTAINER_RUNNING" and doc["info"]["pid"] == a.pid
    assert status["labels"] == {
        "app": "llm",
        "io.kubernetes.container.name": "train",
        "io.kubernetes.pod.name": "trainer-0",
        "io.kubernetes.pod.namespace": "ml",
        "io.kubernetes.pod.uid": a.pod_uid,
    }
    assert status["image"]["image"] == a.image
    out = ssh(node, "crictl", "inspect", str(a.container_id), str(b.container_id))
    docs = json.loads(out.stdout)
    assert [d["status"]["id"] for d in docs] == [a.container_id, b.container_id]
    assert docs[1]["status"]["labels"]["io.kubernetes.pod.namespace"] == "default"
    out = ssh(node, "crictl", "inspect", str(a.container_id), "f00d")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        "FATA[0000] get container status: rpc error: code = NotFound desc = an error occurred "
        'when try to find container "f00d": not found\n'
    )


# ---- Slurm ---------------------------------------------------------------------------------------


def test_scontrol_show_job_and_scancel(node: SimNode) -> None:
    w = node.spawn(gpu=3, mib=512, cgroup="slurm", job_name="sweep-lr", behaviour="respawn")
    out = ssh(node, "scontrol", "show", "job", str(w.job_id))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    me = os.geteuid()
    assert lines[:4] == [
        f"JobId={w.job_id} JobName=sweep-lr",
        f"   UserId={w.user}({me}) GroupId={lines[1].split('GroupId=')[1].split(' ')[0]}"
        " MCS_label=N/A",
        lines[2],
        "   JobState=RUNNING Reason=None Dependency=(null)",
    ]
    assert lines[-2:] == ["", ""]  # the record ends with a blank line
    one = ssh(node, "scontrol", "-o", "show", "job", str(w.job_id)).stdout
    assert one.count("\n") == 1 and one.startswith(f"JobId={w.job_id} JobName=sweep-lr UserId=")
    out = ssh(node, "scancel", str(w.job_id))
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert not w.alive() and w.current_pid() is None
    after = ssh(node, "scontrol", "show", "job", str(w.job_id)).stdout
    assert "   JobState=CANCELLED Reason=None Dependency=(null)" in after.splitlines()
    out = ssh(node, "scontrol", "show", "job", "99")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "slurm_load_jobs error: Invalid job id specified\n"
    out = ssh(node, "scancel", "99")
    assert out.returncode == 1
    assert out.stderr == "scancel: error: Kill job error on job id 99: Invalid job id specified\n"


def test_systemctl_stop_ends_a_service(node: SimNode) -> None:
    w = node.spawn(gpu=0, mib=256, cgroup="service")
    out = ssh(node, "systemctl", "stop", str(w.unit))
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert not w.alive()
    out = ssh(node, "systemctl", "stop", "sshd.service")  # not the fleet's: never this box's
    assert (out.returncode, out.stderr) == (
        5,
        "Failed to stop sshd.service: Unit sshd.service not loaded.\n",
    )


def test_a_delay_makes_every_stand_in_slow(node: SimNode) -> None:
    w = node.spawn(gpu=0, mib=256, cgroup="docker")
    node.set_runtime_delay(1.5)
    t0 = time.monotonic()
    out = ssh(node, "docker", "inspect", str(w.container_id))
    assert out.returncode == 0 and time.monotonic() - t0 >= 1.5
    t0 = time.monotonic()
    out = ssh(node, "scontrol", "show", "job", "1")
    assert out.returncode == 1 and time.monotonic() - t0 >= 1.5
    node.set_runtime_delay(0)
    with pytest.raises(SimUsageError):
        node.set_runtime_delay(-1)


# ---- the Python API's refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"cgroup": "lxc"}, "unknown cgroup kind 'lxc'"),
        ({"image": "x"}, "image needs a cgroup kind"),
        ({"cgroup": "docker", "pod": "a/b"}, "a docker workload takes no pod"),
        ({"cgroup": "slurm", "restart": "always"}, "a slurm workload takes no restart"),
        ({"cgroup": "docker", "restart": "sometimes"}, "unknown restart policy 'sometimes'"),
        ({"cgroup": "docker", "container_name": "-x"}, "bad container name '-x'"),
        ({"cgroup": "docker", "labels": {"a=b": "c"}}, "bad label 'a=b'='c'"),
        ({"cgroup": "kubernetes", "pod": "NoSlash"}, "bad pod 'NoSlash'"),
        ({"cgroup": "docker", "restart": "always", "behaviour": "stubborn"}, "restarts a normal"),
        ({"cgroup": "slurm", "job_user": "root", "user": "nobody"}, "runs as its user (root)"),
    ],
)
def test_bad_requests_are_usage_errors(node: SimNode, kwargs: dict[str, Any], text: str) -> None:
    with pytest.raises(SimUsageError, match=text.replace("(", r"\(").replace(")", r"\)")):
        node.spawn(gpu=0, **kwargs)
    assert node.registry() == [] and node.live_pids() == []


def test_a_container_name_is_taken_once(node: SimNode) -> None:
    node.spawn(gpu=0, mib=256, cgroup="docker", container_name="only")
    with pytest.raises(SimUsageError, match='the container name "only" is already in use'):
        node.spawn(gpu=0, mib=256, cgroup="docker", container_name="only")
    node.spawn(gpu=0, mib=256, cgroup="podman", container_name="only")  # another runtime's


def test_without_a_cgroup2_hierarchy_the_reason_is_one_line() -> None:
    mounts = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
    assert find_hierarchies(mounts, "0::/\n") == (
        "no cgroup2 hierarchy is mounted (at its root) on this machine"
    )
    sub = "41 31 0:38 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"  # a container's view
    assert isinstance(find_hierarchies(sub, "0::/\n"), str)
    hybrid = (
        "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert find_hierarchies(hybrid, "4:memory:/\n0::/\n") == Hierarchies(
        "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/memory"
    )
    # In someone else's memory cgroup (a sandbox, a CI job): workloads stay in it.
    assert find_hierarchies(hybrid, "4:memory:/job/7\n0::/\n") == Hierarchies(
        "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", None
    )


# ---- cleaning up ---------------------------------------------------------------------------------


def test_the_fleet_removes_every_cgroup_it_made(
    cgroups_ok: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    f = SimFleet(tmp_path_factory.mktemp("cg-stop"), nodes=1, gpus=2, release_delay_s=0.1)
    f.start()
    try:
        n = f.node("node1")
        made: list[Workload] = [n.spawn(gpu=0, mib=64, cgroup=k) for k in KINDS]
        made.append(n.spawn(gpu=1, mib=64, cgroup="docker", restart="always"))
        tops = [e["top"] for e in n.registry()]
        assert len(tops) == len(made) and all(os.path.isdir(t) for t in tops)
    finally:
        f.stop()
    assert not [t for t in tops if os.path.exists(t)]
    assert not [w for w in made if w.alive()]
    reg = json.loads(Path("/tmp/gpusim-cgroups.json").read_text())
    assert not [o for o in reg["owned"] if o[1] == os.getpid()]


def test_a_directory_it_did_not_make_is_kept(cgroups_ok: None) -> None:
    """A private cgroup tree stands in for a hierarchy's root: a parent that was there before
    stays, the parents the simulation made go, the workload's own directories go."""
    found = find_hierarchies(
        Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    )
    assert not isinstance(found, str)
    root = Path(found.v2) / f"gpusim-test-{os.getpid()}"
    root.mkdir()
    try:
        (root / "machine.slice").mkdir()  # "there before"
        cgs = CgroupSet(Hierarchies(str(root)))
        pods = cgs.create("podman", 0)
        dock = cgs.create("docker", 0)
        assert os.path.isdir(pods.top) and os.path.isdir(dock.top)
        assert cgs.release(pods) == [] and cgs.release(dock) == []
        assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["machine.slice"]
    finally:
        for d in sorted(root.rglob("*"), key=lambda p: -len(str(p))):
            if d.is_dir():
                d.rmdir()
        root.rmdir()


# ---- PATH and sudo -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["asyncssh", "sshd"])
def sudo_fleet(
    cgroups_ok: None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    """The README's sudo rule and the runtime stand-ins, behind asyncssh, then OpenSSH sshd."""
    server = str(request.param)
    if server == "sshd" and not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} is not installed here")
    with SimFleet(
        tmp_path_factory.mktemp(f"cg-sudo-{server}"),
        nodes=1,
        gpus=2,
        server=server,
        runtimes=True,
        sudo_rule=readme_sudo_rule(README),
    ) as f:
        yield f


def test_sudo_comes_first_then_the_runtimes(sudo_fleet: SimFleet) -> None:
    node = sudo_fleet.node("node1")
    raw = "tr '\\0' '\\n' < /proc/$$/environ; command -v sudo docker scancel systemctl"
    out = subprocess.run(
        [*node.ssh_argv("true")[:-1], raw], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"PATH={node.sudo_dir}:{node.runtime_dir}:{node.kernlog_dir}:{STD_PATH}" in lines
    stand_ins = [str(node.runtime_dir / p) for p in ("docker", "scancel", "systemctl")]
    assert lines[-4:] == [str(node.sudo_dir / "sudo"), *stand_ins]
    assert load(sudo_fleet.config_path).nodes[0].runtimes == ("docker", "podman", "slurm", "crictl")


def test_sudo_runs_the_readme_commands_of_the_node_only(sudo_fleet: SimFleet) -> None:
    node = sudo_fleet.node("node1")
    try:
        w = node.spawn(gpu=0, mib=256, cgroup="docker", container_name="c1", restart="always")
        s = node.spawn(gpu=1, mib=256, cgroup="service")
        out = ssh(node, "sudo", "-n", "docker", "inspect", "c1")
        assert out.returncode == 0 and json.loads(out.stdout)[0]["Id"] == w.container_id
        call = node.sudo_log()[-1]
        assert (
            call["verdict"] == "run" and call["command"] == f"{node.runtime_dir}/docker inspect c1"
        )
        for refused in (["docker", "rm", "c1"], ["systemctl", "restart", str(s.unit)]):
            out = ssh(node, "sudo", "-n", *refused)
            assert (out.returncode, out.stderr) == (1, PASSWORD_REQUIRED + "\n")
        assert w.alive() and s.alive()
        for stop in (["docker", "stop", "c1"], ["systemctl", "stop", str(s.unit)]):
            out = ssh(node, "sudo", "-n", *stop)
            assert out.returncode == 0, out.stderr
        assert not w.alive() and not s.alive()
    finally:
        node.clear()


def test_without_the_stand_ins_sudo_finds_no_docker(
    cgroups_ok: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A sudo node without runtimes never runs this machine's own docker or systemctl."""
    with SimFleet(
        tmp_path_factory.mktemp("cg-bare"), nodes=1, gpus=1, sudo_rule=readme_sudo_rule(README)
    ) as f:
        node = f.node("node1")
        for argv in (["docker", "inspect", "x"], ["systemctl", "stop", "x.service"]):
            out = ssh(node, "sudo", "-n", *argv)
            assert (out.returncode, out.stdout, out.stderr) == (1, "", PASSWORD_REQUIRED + "\n")
            assert node.sudo_log()[-1]["verdict"] == "denied"


# ---- the CLI -------------------------------------------------------------------------------------


def gpubot(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gpubot", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def test_the_cli_spawns_into_a_cgroup(
    cgroups_ok: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    up = gpubot("sim", "up", "--dir", tmp_path, "--nodes", "1", "--gpus", "1", "--runtimes")
    assert up.returncode == 0, up.stderr
    try:
        out = gpubot(
            "sim",
            "spawn",
            "--dir",
            tmp_path,
            "--node",
            "node1",
            "--gpu",
            "0",
            "--cgroup",
            "docker",
            "--container-name",
            "cli-train",
            "--image",
            "img:1",
            "--label",
            "owner=bob",
            "--label",
            "x=",
            "--restart",
            "always",
        )
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert (doc["cgroup_kind"], doc["container_name"], doc["image"], doc["restart"]) == (
            "docker",
            "cli-train",
            "img:1",
            "always",
        )
        assert doc["labels"] == {"owner": "bob", "x": ""} and doc["supervisor_pid"]
        found = parse_cgroup(cgroup_of(doc["pid"]))
        assert found is not None and found.id == doc["container_id"]
        for args, text in [
            (["--cgroup", "lxc"], "unknown cgroup kind 'lxc'"),
            (["--cgroup", "docker", "--label", "novalue"], "--label wants KEY=VALUE"),
            (["--cgroup", "docker", "--restart", "sometimes"], "unknown restart policy"),
            (["--cgroup", "docker", "--job-name", "j"], "a docker workload takes no job_name"),
            (["--image", "x"], "image needs a cgroup kind"),
            (["--cgroup", "docker", "--container-name", "cli-train"], "is already in use"),
        ]:
            capsys.readouterr()
            rc = main(
                ["sim", "spawn", "--dir", str(tmp_path), "--node", "node1", "--gpu", "0", *args]
            )
            err = capsys.readouterr().err
            assert rc != 0 and err.count("\n") == 1 and "Traceback" not in err, err
            assert err.startswith("gpubot: error: ") and text in err, err
    finally:
        down = gpubot("sim", "down", "--dir", tmp_path)
    assert down.returncode == 0, down.stderr
    assert not simstate.is_alive(doc["pid"], doc["start_ticks"])
    trees = find_hierarchies(
        Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    )
    assert not isinstance(trees, str)
    assert not os.path.exists(trees.v2 + doc["cgroup_path"])
