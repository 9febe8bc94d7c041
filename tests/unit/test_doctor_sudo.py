"""``sudo -n -l`` against the README's sudoers rule: no more, no less (``core.doctor.sudo``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubot.core.doctor.sudo import Grant, SudoNeeds, parse_sudo_list, sudo_check
from gpusim.sudo import listing
from gpusim.sudoers import parse_sudoers, readme_sudo_rule

README = Path(__file__).resolve().parents[2] / "README.md"

# The README's rule in the layout sudo 1.9 prints for `sudo -l` (Defaults first, each entry
# wrapped at 80 columns onto lines indented by eight spaces).
REAL = """Matching Defaults entries for gpubot on gpu3:
    env_reset, mail_badpass,
    secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/sbin\\:/usr/bin\\:/sbin\\:/bin,
    use_pty

User gpubot may run the following commands on gpu3:
    (root) NOPASSWD: /usr/bin/fuser -v /dev/nvidia[0-9]*, /usr/sbin/fuser -v
        /dev/nvidia[0-9]*, /usr/bin/kill -s TERM [0-9]*, /usr/bin/kill -s KILL
        [0-9]*, /usr/bin/nvidia-smi --gpu-reset -i [0-9]*, /usr/bin/nvidia-smi -pm
        0 -i [0-9]*, /usr/bin/nvidia-smi -pm 1 -i [0-9]*, /usr/bin/docker inspect
        *, /usr/bin/podman inspect *, /usr/bin/crictl inspect *, /usr/bin/docker
        stop *, /usr/bin/podman stop *, /usr/bin/scancel *, /usr/bin/systemctl stop
        *, /usr/bin/scontrol update NodeName\\=* State\\=DRAIN Reason\\=*,
        /usr/bin/scontrol update NodeName\\=* State\\=RESUME
"""


def readme_listing(rule_text: str | None = None, **over: object) -> str:
    rule = parse_sudoers(rule_text or readme_sudo_rule(README))
    return listing({**rule, "host": "gpu3", **over})


def test_the_wrapped_listing_parses_into_the_readmes_commands() -> None:
    grants = parse_sudo_list(REAL)
    assert len(grants) == 16
    assert grants[1] == Grant("root", True, "/usr/sbin/fuser -v /dev/nvidia[0-9]*")
    assert grants[13].command == "/usr/bin/systemctl stop *"
    assert grants[-1].command == r"/usr/bin/scontrol update NodeName\=* State\=RESUME"
    assert sudo_check("gpu3", REAL, 0, SudoNeeds()).ok


def test_the_simulators_listing_is_the_readmes_rule() -> None:
    assert parse_sudo_list(readme_listing()) == parse_sudo_list(REAL)


def edited(old: str, new: str) -> str:
    text = readme_sudo_rule(README)
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (
            edited("/usr/bin/kill -s TERM [0-9]*", "/usr/bin/kill"),
            "/usr/bin/kill (any arguments)",
        ),
        (edited("GPUBOT_DRAIN\n", "GPUBOT_DRAIN, /bin/bash -c *\n"), "/bin/bash -c *"),
        (edited("/usr/bin/scancel *", "/usr/bin/* *"), "a path with wildcards"),
    ],
)
def test_too_wide(rule: str, words: str) -> None:
    check = sudo_check("gpu3", readme_listing(rule), 0, SudoNeeds())
    assert not check.ok and "too wide" in check.detail and words in check.detail
    assert "remove" in check.fix


def test_all_is_too_wide() -> None:
    rule = {"user": "gpubot", "runas": "root", "nopasswd": True, "commands": ["ALL"]}
    check = sudo_check("gpu3", listing({**rule, "host": "gpu3"}), 0, SudoNeeds())
    assert not check.ok and "ALL (every command)" in check.detail


def test_a_run_as_other_than_root_is_too_wide() -> None:
    text = readme_listing().replace("(root)", "(ALL : ALL)")
    check = sudo_check("gpu3", text, 0, SudoNeeds())
    assert not check.ok and "as (ALL : ALL)" in check.detail


@pytest.mark.parametrize(
    ("rule", "needs", "words"),
    [
        (edited(", GPUBOT_KILL,", ","), SudoNeeds(), "kill -s TERM [0-9]*"),
        (
            edited("GPUBOT_FUSER, ", ""),
            SudoNeeds(),
            "fuser -v /dev/nvidia[0-9]*",
        ),
        (
            edited(", GPUBOT_INSPECT", ""),
            SudoNeeds(runtimes=("docker",)),
            "docker inspect *",
        ),
        (
            edited(", GPUBOT_STOP", ""),
            SudoNeeds(runtimes=("slurm",), stop_workloads=True),
            "scancel *",
        ),
        (
            edited("/usr/bin/nvidia-smi -pm 0 -i [0-9]*, ", ""),
            SudoNeeds(toggle_persistence=True),
            "nvidia-smi -pm 0 -i [0-9]*",
        ),
    ],
)
def test_too_narrow(rule: str, needs: SudoNeeds, words: str) -> None:
    check = sudo_check("gpu3", readme_listing(rule), 0, needs)
    assert not check.ok and "too narrow" in check.detail and words in check.detail
    alias = {"kill": "KILL", "fuser": "FUSER", "docker": "INSPECT", "scancel": "STOP"}
    assert check.fix.startswith(f"add GPUBOT_{alias.get(words.split()[0], 'RESET')} as")


def test_what_the_settings_do_not_use_may_stay_out() -> None:
    rule = edited(", GPUBOT_INSPECT, GPUBOT_STOP", "")
    assert sudo_check("gpu3", readme_listing(rule), 0, SudoNeeds()).ok


def test_a_rule_with_a_password_is_too_narrow() -> None:
    check = sudo_check("gpu3", readme_listing(nopasswd=False), 0, SudoNeeds())
    assert not check.ok and "no NOPASSWD rule" in check.detail


def test_another_device_prefix_is_both_wide_and_missing() -> None:
    check = sudo_check("gpu3", REAL, 0, SudoNeeds(dev_prefix="/srv/dev/nvidia"))
    assert not check.ok and "/dev/nvidia[0-9]*" in check.detail


@pytest.mark.parametrize(
    ("text", "status", "words"),
    [
        ("sudo: a password is required\n", 1, "a password is required"),
        ("Sorry, user gpubot may not run sudo on gpu3.\n", 1, "may not run sudo"),
        ("", 124, "in time"),
    ],
)
def test_no_rule(text: str, status: int, words: str) -> None:
    check = sudo_check("gpu3", text, status, SudoNeeds())
    assert not check.ok and words in check.detail


def test_no_sudo_installed() -> None:
    check = sudo_check("gpu3", None, None, SudoNeeds())
    assert not check.ok and check.fix == "install sudo"


# Shapes of real ``sudo -l`` answers (public write-ups): one entry a line, tags, run-as lists.
SHAPES = """Matching Defaults entries for john on box:
    env_reset, mail_badpass, secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/bin

User john may run the following commands on box:
    (ALL) NOPASSWD: /usr/bin/nano
    (ALL) SETENV: NOPASSWD: /sbin/initctl
    (ALL, !root) /bin/bash
    (ALL : ALL) NOPASSWD: /usr/bin/systemctl status trail.service
"""


def test_real_shapes_parse() -> None:
    assert parse_sudo_list(SHAPES) == (
        Grant("ALL", True, "/usr/bin/nano"),
        Grant("ALL", True, "/sbin/initctl"),
        Grant("ALL, !root", False, "/bin/bash"),
        Grant("ALL : ALL", True, "/usr/bin/systemctl status trail.service"),
    )
    check = sudo_check("box", SHAPES, 0, SudoNeeds())
    assert not check.ok and "too wide" in check.detail and "/usr/bin/nano" in check.detail
