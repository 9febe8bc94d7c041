"""One definition of the user-name rule, the node-name rule and the sudo prefix
(``gpubot.core.names``), and every place that checks one of them agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpubot
from gpubot.config import parse
from gpubot.core import commands, workload
from gpubot.core.commands import Reset
from gpubot.core.enrich import enrich_argv
from gpubot.core.names import LINUX_USER, NODE_NAME, SUDO, as_root, is_linux_user
from gpubot.core.policy import Policy, linux_user
from gpubot.core.reset.signals import SIGNAL_SCRIPT
from gpubot.core.reset.stop_script import STOP_SCRIPT
from gpubot.errors import ConfigError, UsageError

USERS = [
    ("alice", True),
    ("_svc", True),
    ("first.last", True),  # SSSD/winbind accounts; shadow-utils' useradd allows '.'
    ("build-bot_2", True),
    ("host$", True),  # a Samba machine account: shadow-utils' one extension
    ("a" * 32, True),
    ("a" * 33, False),
    ("Alice", False),  # lowercase only
    ("1alice", False),  # a leading digit could be read as a uid
    ("-alice", False),  # POSIX: never a leading hyphen
    (".alice", False),
    (".", False),
    ("..", False),
    ("al ice", False),
    ("al$ice", False),  # '$' only last
    ("alice;id", False),
    ("", False),
]


@pytest.mark.parametrize(("name", "ok"), USERS)
def test_the_user_name_rule(name: str, ok: bool) -> None:
    assert is_linux_user(name) is ok
    assert workload.valid_user(name) is ok  # the owner of a workload, from the node's answer


@pytest.mark.parametrize(("name", "ok"), [(n, ok) for n, ok in USERS if n])  # '': no word
def test_reset_as_user_follows_the_rule(name: str, ok: bool) -> None:
    if ok:
        got = commands.parse(f"reset node1 user {name}")
        assert isinstance(got, Reset) and got.user == name
    else:
        with pytest.raises(UsageError, match=r"bad user name|unexpected"):
            commands.parse(f"reset node1 user {name}")


@pytest.mark.parametrize(("name", "ok"), USERS)
def test_the_settings_file_follows_the_rule(name: str, ok: bool) -> None:
    tables = {"users": {"U0ALICE": name}}
    if ok:
        assert parse(tables, "g.toml").policy.users == {"U0ALICE": name}
    else:
        with pytest.raises(ConfigError, match="expected a Linux user name"):
            parse(tables, "g.toml")


def test_an_email_local_part_with_a_dot_maps_to_that_user() -> None:
    p = Policy(email_local_part=True, email_domains=("lab.org",))
    assert linux_user(p, "U0A", "First.Last@lab.org") == "first.last"
    assert linux_user(p, "U0A", "first last@lab.org") is None


def test_no_module_defines_a_rule_of_its_own() -> None:
    package = Path(gpubot.__file__).parent
    rules = {LINUX_USER.pattern.split("{")[0], NODE_NAME.pattern.split("{")[0], '"sudo", "-n"'}
    for path in package.rglob("*.py"):
        where = path.relative_to(package)
        if where.name == "names.py":
            continue
        text = path.read_text()
        assert not [r for r in rules if r in text], path


@pytest.mark.parametrize(("name", "ok"), [("node-1", True), ("gpu.lab_2", True), ("-x", False)])
def test_the_node_name_rule(name: str, ok: bool) -> None:
    assert (NODE_NAME.fullmatch(name) is not None) is ok
    tables = {"nodes": [{"name": name, "host": "h"}]}
    if ok:
        assert parse(tables, "g.toml").nodes[0].name == name
    else:
        with pytest.raises(ConfigError):
            parse(tables, "g.toml")


def test_the_sudo_prefix_is_built_from_one_constant() -> None:
    assert SUDO == ("sudo", "-n")
    assert as_root(["nvidia-smi", "-r"], sudo=True) == ["sudo", "-n", "nvidia-smi", "-r"]
    assert as_root(["nvidia-smi", "-r"], sudo=False) == ["nvidia-smi", "-r"]
    argv = enrich_argv("docker", ["a" * 64], timeout_s=2, sudo=True)
    assert argv[4:7] == ["sudo", "-n", "docker"]
    assert enrich_argv("docker", ["a" * 64], timeout_s=2, sudo=False)[4] == "docker"
    assert 'exec sudo -n "$@"' in STOP_SCRIPT and "@SUDO@" not in STOP_SCRIPT
    assert 'then sudo -n kill "$@"' in SIGNAL_SCRIPT and "@SUDO@" not in SIGNAL_SCRIPT
