"""The sudo stand-in of "sudo nodes": over real SSH (asyncssh and OpenSSH sshd), only
``sudo -n`` and only the commands of the README's sudoers rule run; every call is logged."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.config import load
from gpusim.fleet import SimFleet, SimNode
from gpusim.server import STD_PATH
from gpusim.sudo import PASSWORD_REQUIRED, resolve
from gpusim.sudoers import command_matches, node_rule, parse_sudoers, readme_sudo_rule

README = Path(__file__).resolve().parents[2] / "README.md"
RULE = (
    "Cmnd_Alias GPUBOT_FUSER = /usr/bin/fuser -v /dev/nvidia[0-9]*, "
    "/usr/sbin/fuser -v /dev/nvidia[0-9]*\n"
    "Cmnd_Alias GPUBOT_KILL  = /usr/bin/kill -s TERM [0-9]*, /usr/bin/kill -s KILL [0-9]*\n"
    "Cmnd_Alias GPUBOT_RESET = /usr/bin/nvidia-smi --gpu-reset -i [0-9]*, "
    "/usr/bin/nvidia-smi -pm 0 -i [0-9]*, /usr/bin/nvidia-smi -pm 1 -i [0-9]*\n"
    "# Only needed with a node's `runtimes` (GPUBOT_INSPECT) and with [reset] stop_workloads "
    "(GPUBOT_STOP):\n"
    "Cmnd_Alias GPUBOT_INSPECT = /usr/bin/docker inspect *, /usr/bin/podman inspect *, "
    "/usr/bin/crictl inspect *\n"
    "Cmnd_Alias GPUBOT_STOP  = /usr/bin/docker stop *, /usr/bin/podman stop *, "
    "/usr/bin/scancel *, /usr/bin/systemctl stop *\n"
    "# Only on Slurm nodes, for /gpu drain and /gpu resume (GPUBOT_DRAIN):\n"
    r"Cmnd_Alias GPUBOT_DRAIN = /usr/bin/scontrol update NodeName\=* State\=DRAIN Reason\=*, "
    r"/usr/bin/scontrol update NodeName\=* State\=RESUME"
    "\n"
    "gpubot ALL=(root) NOPASSWD: GPUBOT_FUSER, GPUBOT_KILL, GPUBOT_RESET, GPUBOT_INSPECT, "
    "GPUBOT_STOP, GPUBOT_DRAIN\n"
)


# ---- the rule itself (no SSH) ----------------------------------------------------------------


def test_readme_holds_exactly_the_rule() -> None:
    assert readme_sudo_rule(README) == RULE
    rule = parse_sudoers(RULE)
    assert rule["user"] == "gpubot" and rule["runas"] == "root" and rule["nopasswd"] is True
    assert rule["commands"] == [
        "/usr/bin/fuser -v /dev/nvidia[0-9]*",
        "/usr/sbin/fuser -v /dev/nvidia[0-9]*",
        "/usr/bin/kill -s TERM [0-9]*",
        "/usr/bin/kill -s KILL [0-9]*",
        "/usr/bin/nvidia-smi --gpu-reset -i [0-9]*",
        "/usr/bin/nvidia-smi -pm 0 -i [0-9]*",
        "/usr/bin/nvidia-smi -pm 1 -i [0-9]*",
        "/usr/bin/docker inspect *",
        "/usr/bin/podman inspect *",
        "/usr/bin/crictl inspect *",
        "/usr/bin/docker stop *",
        "/usr/bin/podman stop *",
        "/usr/bin/scancel *",
        "/usr/bin/systemctl stop *",
        r"/usr/bin/scontrol update NodeName\=* State\=DRAIN Reason\=*",
        r"/usr/bin/scontrol update NodeName\=* State\=RESUME",
    ]


@pytest.mark.parametrize(
    ("path", "args", "ok"),
    [
        ("/usr/bin/fuser", "-v /n x/dev/nvidia0 /n x/dev/nvidiactl", True),
        ("/usr/sbin/fuser", "-v /n x/dev/nvidia7", True),
        ("/usr/bin/fuser", "-v /n x/dev/nvidiactl", False),  # no GPU device first
        ("/usr/bin/fuser", "-v /dev/nvidia0", False),  # the host's, not the node's
        ("/usr/bin/fuser", "-k /n x/dev/nvidia0", False),
        ("/usr/bin/kill", "-s TERM 123", True),
        ("/usr/bin/scontrol", "update NodeName=gpu3 State=DRAIN Reason=gpubot: xid 79", True),
        ("/usr/bin/scontrol", "update NodeName=gpu3 State=RESUME", True),
        ("/usr/bin/scontrol", "update NodeName=gpu3 State=DOWN Reason=x", False),
        ("/usr/bin/scontrol", "delete NodeName=gpu3", False),
        ("/usr/bin/kill", "-s KILL 123 456", True),  # wildcards match spaces too
        ("/usr/bin/kill", "-s HUP 123", False),
        ("/usr/bin/kill", "-s TERM -1", False),
        ("/usr/bin/kill", "-9 123", False),
        ("/usr/local/bin/kill", "-s TERM 123", False),
        ("/n x/bin/nvidia-smi", "--gpu-reset -i 3", True),
        ("/n x/bin/nvidia-smi", "--gpu-reset -i", False),
        ("/n x/bin/nvidia-smi", "-L", False),
        ("/usr/bin/nvidia-smi", "--gpu-reset -i 3", False),  # the host's, not the node's
        ("/bin/sh", "-c id", False),
    ],
)
def test_rule_matches_like_sudoers(path: str, args: str, ok: bool) -> None:
    rule = node_rule(parse_sudoers(RULE), "n", "/n x/dev/nvidia", "/n x/bin/nvidia-smi", "/l")
    assert any(command_matches(p, path, args.split(" ")) for p in rule["commands"]) is ok


@pytest.mark.parametrize(
    ("pattern", "args", "ok"),
    [
        ("/bin/echo", ["anything", "at all"], True),  # no arguments in the rule: any
        ('/bin/echo ""', [], True),  # "": none
        ('/bin/echo ""', ["x"], False),
        ("/bin/echo a[!0-9]b", ["axb"], True),
        ("/bin/echo a[!0-9]b", ["a1b"], False),
        ("/bin/echo a?c", ["a/c"], True),  # in arguments, wildcards match slashes
        ("/bin/ech?", ["x"], True),
        ("/bin/*", ["x"], True),
        ("/*/echo", ["x"], True),
        ("/*echo", ["x"], False),  # in the path, they do not
        ("/bin/echo \\*", ["*"], True),
        ("/bin/echo \\*", ["x"], False),
    ],
)
def test_wildcards(pattern: str, args: list[str], ok: bool) -> None:
    assert command_matches(pattern, "/bin/echo", args) is ok


@pytest.mark.parametrize(
    "bad",
    [
        "Defaults !authenticate\n" + RULE,
        RULE + "gpubot ALL=(root) NOPASSWD: !/bin/sh\n",
        RULE.replace("GPUBOT_DRAIN\n", "GPUBOT_DRIAN\n"),
        RULE.replace("(root)", "(ALL : wheel)"),
        RULE + "alice ALL=(root) NOPASSWD: /bin/true\n",
        "gpubot ALL=(root) NOPASSWD: ALL\n",
    ],
)
def test_unsupported_rules_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_sudoers(bad)


# ---- over SSH ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["asyncssh", "sshd"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    """A one-node fleet with the README's rule, served by asyncssh, then by sshd."""
    server = str(request.param)
    with SimFleet(
        tmp_path_factory.mktemp(f"sudo-{server}"),
        nodes=1,
        gpus=2,
        server=server,
        sudo_rule=readme_sudo_rule(README),
    ) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    n.clear()
    yield n
    n.clear()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's own, the only one these tests ever signal."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def ssh(node: SimNode, *remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(node.ssh_argv(*remote), capture_output=True, text=True, timeout=60)


def last_call(node: SimNode) -> dict[str, object]:
    log = node.sudo_log()
    assert log, "the stand-in logged nothing"
    return log[-1]


def test_the_stand_in_comes_first_on_the_session_path(fleet: SimFleet, node: SimNode) -> None:
    # /proc/$$/environ: what the server gave the session's shell, before any rc file ran.
    raw = "tr '\\0' '\\n' < /proc/$$/environ; command -v sudo"
    argv = [*node.ssh_argv("true")[:-1], raw]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # for sshd: its SetEnv took effect (the kernel log's stand-ins after sudo's: gpusim.kernlog)
    assert f"PATH={node.sudo_dir}:{node.kernlog_dir}:{STD_PATH}" in lines
    assert lines[-1] == str(node.sudo_dir / "sudo")
    assert load(fleet.config_path).nodes[0].sudo is True


def test_fuser_of_the_node_devices_is_allowed_and_runs(node: SimNode) -> None:
    w = node.spawn(gpu=0, mib=2048)
    out = ssh(node, "sudo", "-n", "fuser", "-v", node.device(0), f"{node.dev_prefix}ctl")
    assert out.returncode == 0, out.stderr
    assert str(w.pid) in out.stdout.split()
    assert f"{node.dev_prefix}ctl:" in out.stderr
    call = last_call(node)
    fuser = resolve("fuser")
    assert call["allowed"] is True and call["verdict"] == "run"
    assert call["command"] == f"{fuser} -v {node.device(0)} {node.dev_prefix}ctl"
    assert call["argv"] == ["-n", "fuser", "-v", node.device(0), f"{node.dev_prefix}ctl"]


def test_kill_term_is_allowed_and_kills(node: SimNode, sleeper: subprocess.Popen[bytes]) -> None:
    out = ssh(node, "sudo", "-n", "kill", "-s", "TERM", str(sleeper.pid))
    assert out.returncode == 0, out.stderr
    assert sleeper.wait(timeout=10) == -15
    call = last_call(node)
    assert call["allowed"] is True and call["command"] == f"/usr/bin/kill -s TERM {sleeper.pid}"


def test_gpu_reset_of_the_node_nvidia_smi_is_allowed(node: SimNode) -> None:
    for cmd in (node.nvidia_smi, "nvidia-smi"):  # gpubot's absolute path, and the bare name
        out = ssh(node, "sudo", "-n", cmd, "--gpu-reset", "-i", "1")
        assert out.returncode == 0, out.stdout + out.stderr
        call = last_call(node)
        assert call["allowed"] is True and call["command"] == f"{node.nvidia_smi} --gpu-reset -i 1"


@pytest.mark.parametrize(
    "argv",
    [
        ["sh", "-c", "id"],
        ["cat", "/etc/shadow"],
        ["kill", "-s", "HUP", "{sleeper}"],
        ["kill", "-9", "{sleeper}"],
        ["fuser", "-k", "{dev}0"],
        ["fuser", "-v", "{dev}ctl"],
        ["nvidia-smi", "-L"],
        ["nosuchcommand"],
    ],
)
def test_anything_else_is_refused_before_it_runs(
    node: SimNode, sleeper: subprocess.Popen[bytes], argv: list[str]
) -> None:
    args = [a.format(sleeper=sleeper.pid, dev=node.dev_prefix) for a in argv]
    w = node.spawn(gpu=0, mib=1024)
    out = ssh(node, "sudo", "-n", *args)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", PASSWORD_REQUIRED + "\n")
    call = last_call(node)
    assert call["allowed"] is False and call["verdict"] == "denied"
    assert call["argv"] == ["-n", *args]
    if call["command"] is not None:
        assert str(call["reason"]).startswith(
            f"Sorry, user gpubot is not allowed to execute '{call['command']}' as root on node1."
        )
    time.sleep(0.2)
    assert sleeper.poll() is None  # neither HUP nor KILL reached it
    assert w.alive()  # nor did fuser -k


@pytest.mark.parametrize(
    ("argv", "verdict", "stderr"),
    [
        (["id"], "no-n", "sudo: a terminal is required"),
        (["-u", "root", "id"], "usage", "sudo: option '-u' is not supported"),
        (["-n", "-u", "root", "id"], "usage", "usage: sudo -n command"),
        (["-n", "--", "id"], "usage", "usage: sudo -n command"),
        (["-n"], "usage", "usage: sudo -n command"),
        (["-n", "/no/such/fuser", "-v"], "not-found", "sudo: /no/such/fuser: command not"),
    ],
)
def test_only_sudo_dash_n_is_accepted(
    node: SimNode, argv: list[str], verdict: str, stderr: str
) -> None:
    out = ssh(node, "sudo", *argv)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(stderr), out.stderr
    call = last_call(node)
    assert (call["allowed"], call["verdict"], call["argv"]) == (False, verdict, argv)


def test_every_call_is_logged_in_order(node: SimNode, sleeper: subprocess.Popen[bytes]) -> None:
    ssh(node, "sudo", "-n", "kill", "-s", "HUP", str(sleeper.pid))
    ssh(node, "sudo", "id")
    ssh(node, "sudo", "-n", "kill", "-s", "KILL", str(sleeper.pid))
    assert sleeper.wait(timeout=10) == -9
    log = node.sudo_log()
    assert [(c["verdict"], c["argv"][-1]) for c in log] == [
        ("denied", str(sleeper.pid)),
        ("no-n", "id"),
        ("run", str(sleeper.pid)),
    ]
    assert all(c["node"] == "node1" for c in log)
