"""The settings loader: every mistake is one line naming the file, the key and the problem."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpubot.config import ResetSettings, load, parse
from gpubot.core.reset.protect import DEFAULT_DAEMON_PATHS, DEFAULT_SYSTEM_USERS, Protection
from gpubot.errors import ConfigError

GOOD = """
[database]
url = "sqlite:///gpubot.db"
[ssh]
known_hosts = "~/.ssh/known_hosts"
connect_timeout_s = 5
command_timeout_s = 20
max_parallel = 64
[[nodes]]
name = "node3"
host = "node3.example.org"
port = 22
user = "gpubot"
key = "~/.ssh/gpubot_ed25519"
dev_prefix = "/dev/nvidia"
sudo = true
groups = ["h200", "team-a"]
"""


def test_the_documented_shape_loads(tmp_path: Path) -> None:
    f = tmp_path / "gpubot.toml"
    f.write_text(GOOD)
    s = load(f)
    (n,) = s.nodes
    assert (n.name, n.port, n.sudo, n.groups, n.device(3)) == (
        "node3",
        22,
        True,
        ("h200", "team-a"),
        "/dev/nvidia3",
    )
    assert s.ssh.max_parallel == 64 and s.groups() == {"h200": ("node3",), "team-a": ("node3",)}


NODE = '[[nodes]]\nname = "{name}"\nhost = "h"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[ssh]\nknwon_hosts = 'x'\n", "ssh.knwon_hosts: unknown key"),
        ("colour = 1\n", "colour: unknown key"),
        (NODE.format(name="a") + NODE.format(name="a"), "nodes[1].name: duplicate node name 'a'"),
        (NODE.format(name="a") + "port = 70000\n", "nodes[0].port: 70000 is not a port number"),
        (NODE.format(name="a") + "port = '22'\n", "nodes[0].port: '22' is not a port number"),
        (NODE.format(name="-bad"), "nodes[0].name: '-bad' must match"),
        (NODE.format(name="a b"), "nodes[0].name: 'a b' must match"),
        (NODE.format(name="x" * 64), "must match"),
        ('[[nodes]]\nname = "a"\n', "nodes[0]: 'name' and 'host' are required"),
        (NODE.format(name="a") + "sudo = 'yes'\n", "nodes[0].sudo: expected true or false"),
        (NODE.format(name="a") + "groups = 'g'\n", "nodes[0].groups: expected a list"),
        ("[ssh]\nmax_parallel = 0\n", "ssh.max_parallel: expected a whole number > 0"),
        ("[ssh]\ncommand_timeout_s = -1\n", "ssh.command_timeout_s: expected a number > 0"),
        ("[database]\nurl = 'postgresql+psycopg://u:secret@h/db'\n", "GPUBOT_DB_PASSWORD"),
        ("[reset]\nprotected = 'Xorg'\n", "reset.protected: expected a list"),
        (
            "[reset]\nprotected = ['nvidia-persistenced']\n",
            "reset.protected: 'nvidia-persistenced' is not an absolute path",
        ),
        (
            "[reset]\nprotected = ['/usr/bin/nvidia-persistenced', 'Xorg']\n",
            "reset.protected: 'Xorg' is not an absolute path",
        ),
        ("[reset]\nprotected = ['usr/bin/Xorg']\n", "'usr/bin/Xorg' is not an absolute path"),
        ("[reset]\nprotected = ['~/bin/dcgm']\n", "'~/bin/dcgm' is not an absolute path"),
        ("[reset]\nprotected = [' /usr/bin/Xorg']\n", "is not an absolute path"),
        ("[reset]\nprotected = ['']\n", "reset.protected: expected a list of non-empty strings"),
        ("[reset]\nprotected = [1]\n", "reset.protected: expected a list of non-empty strings"),
        ("[reset]\nsystem_users = 'root'\n", "reset.system_users: expected a list"),
        ("[reset]\nsystem_users = ['root', '']\n", "reset.system_users: expected a list"),
        ("[reset]\nsystem_users = [0]\n", "reset.system_users: expected a list"),
        ("[reset]\nsystem_user = ['root']\n", "reset.system_user: unknown key"),
    ],
)
def test_mistakes_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(tomllib.loads(text), "/etc/gpubot.toml")
    line = str(err.value)
    assert line.startswith("/etc/gpubot.toml: ") and message in line and "\n" not in line


def test_absolute_path_message_says_why() -> None:
    with pytest.raises(ConfigError) as err:
        parse({"reset": {"protected": ["nvidia-persistenced"]}}, "g.toml")
    assert "never by name" in str(err.value) and "/usr/bin/nvidia-persistenced" in str(err.value)


def test_protection_defaults_and_settings() -> None:
    r = parse({}).reset
    assert (r.protected, r.system_users) == (DEFAULT_DAEMON_PATHS, DEFAULT_SYSTEM_USERS)
    assert r.protection == Protection() == ResetSettings().protection
    text = """
[reset]
protected = ["/opt/nvidia/bin/nvidia-persistenced", "/usr/bin/nv-hostengine"]
system_users = ["root", "nvidia-dcgm"]
"""
    r = parse(tomllib.loads(text)).reset
    assert r.protection == Protection(
        paths=("/opt/nvidia/bin/nvidia-persistenced", "/usr/bin/nv-hostengine"),
        system_users=("root", "nvidia-dcgm"),
    )
    only_users = parse({"reset": {"system_users": ["nvidia-persistenced"]}}).reset.protection
    assert only_users == Protection(DEFAULT_DAEMON_PATHS, ("nvidia-persistenced",))
    # empty lists: nothing is protected (every holder can be signalled)
    none = parse({"reset": {"protected": [], "system_users": []}}).reset.protection
    assert none == Protection(paths=(), system_users=())


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[ssh\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)


def test_runtimes_come_from_the_node_and_its_groups() -> None:
    s = parse(
        tomllib.loads(
            '[groups.slurm-h200]\nruntimes = ["slurm"]\n'
            '[attribution]\ncontainer_owner_label = "com.example.owner"\nlookup_timeout_s = 2\n'
            "[reset]\nstop_workloads = true\n"
            '[[nodes]]\nname = "a"\nhost = "h"\nruntimes = ["docker"]\ngroups = ["slurm-h200"]\n'
            '[[nodes]]\nname = "b"\nhost = "h"\n'
        )
    )
    assert [n.runtimes for n in s.nodes] == [("docker", "slurm"), ()]
    assert s.attribution.container_owner_label == "com.example.owner"
    assert s.attribution.lookup_timeout_s == 2 and s.reset.stop_workloads
    d = parse({})
    assert d.attribution.container_owner_label is None and not d.reset.stop_workloads


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            NODE.format(name="a") + "runtimes = ['lxc']\n",
            "nodes[0].runtimes: unknown runtime 'lxc' (one of docker, podman, slurm, crictl)",
        ),
        (NODE.format(name="a") + "runtimes = 'docker'\n", "nodes[0].runtimes: expected a list"),
        (
            "[groups.g]\nruntimes = ['k8s']\n" + NODE.format(name="a") + "groups = ['g']\n",
            "groups.g.runtimes: unknown runtime 'k8s'",
        ),
        ("[groups.g]\nruntime = ['docker']\n", "groups.g.runtime: unknown key"),
        (
            "[groups.g]\nruntimes = ['docker']\n" + NODE.format(name="a"),
            "groups.g: no node is in group 'g'",
        ),
        (
            "[attribution]\ncontainer_owner_label = 'own er'\n",
            "attribution.container_owner_label: expected a label key",
        ),
        ("[attribution]\ncontainer_owner_label = 3\n", "attribution.container_owner_label"),
        ("[attribution]\nlookup_timeout_s = 0\n", "attribution.lookup_timeout_s: expected"),
        ("[attribution]\nlabel = 'x'\n", "attribution.label: unknown key"),
        ("[reset]\nstop_workloads = 'yes'\n", "reset.stop_workloads: expected true or false"),
    ],
)
def test_attribution_mistakes_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(tomllib.loads(text), "/etc/gpubot.toml")
    line = str(err.value)
    assert line.startswith("/etc/gpubot.toml: ") and message in line and "\n" not in line


def test_a_group_s_scheduler_is_its_nodes() -> None:
    s = parse(
        tomllib.loads(
            '[groups.slurm-h200]\nscheduler = "slurm"\n'
            '[[nodes]]\nname = "a"\nhost = "h"\ngroups = ["slurm-h200"]\n'
            '[[nodes]]\nname = "b"\nhost = "h"\ngroups = ["slurm-h200"]\nslurm_node = "gpu-b"\n'
            '[[nodes]]\nname = "c"\nhost = "h"\n'
        )
    )
    got = [(n.name, n.scheduler, n.slurm_name) for n in s.nodes]
    assert got == [("a", "slurm", "a"), ("b", "slurm", "gpu-b"), ("c", None, "c")]


SLURM_GROUP = '[groups.g]\nscheduler = "slurm"\n' + NODE.format(name="a") + 'groups = ["g"]\n'


def test_a_node_naming_another_scheduler_than_its_group_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slurm is the one scheduler known, so a second is played (``pbs``) for the clash to be
    reachable; the same node naming its group's scheduler is the control."""
    monkeypatch.setattr("gpubot.config.nodes.SCHEDULERS", ("slurm", "pbs"))
    (same,) = parse(tomllib.loads(SLURM_GROUP + 'scheduler = "slurm"\n')).nodes
    assert same.scheduler == "slurm"
    with pytest.raises(ConfigError) as err:
        parse(tomllib.loads(SLURM_GROUP + 'scheduler = "pbs"\n'), "/etc/gpubot.toml")
    assert str(err.value) == (
        "/etc/gpubot.toml: nodes[0].scheduler: 'pbs', but its group 'g' says 'slurm'"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (NODE.format(name="a") + "scheduler = 'pbs'\n", "unknown scheduler 'pbs' (one of slurm)"),
        (SLURM_GROUP.replace('"slurm"', '"lsf"', 1), "groups.g.scheduler: unknown scheduler"),
        (SLURM_GROUP + "slurm_node = 'a b'\n", "nodes[0].slurm_node: 'a b' is not a node name"),
    ],
)
def test_scheduler_mistakes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(tomllib.loads(text), "/etc/gpubot.toml")
    line = str(err.value)
    assert line.startswith("/etc/gpubot.toml: ") and message in line and "\n" not in line
