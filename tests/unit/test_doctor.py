"""``gpubot doctor``'s pure decisions: did-you-mean, bash versions, facts into checks, rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubot.config.doctor import config_checks
from gpubot.core.doctor.checks import (
    Check,
    as_document,
    bash_check,
    failed,
    passed,
    render,
    unknown_key,
)
from gpubot.core.doctor.facts import DbFacts, db_checks
from gpubot.core.doctor.node import (
    NodeFacts,
    doctor_argv,
    node_checks,
    parse_facts,
    proc_check,
    runtime_argv,
    runtime_check,
)
from gpubot.core.models import NodeConfig
from gpubot.core.policy import Policy
from gpubot.slack.doctor_checks import SlackFacts, needed_scopes, slack_checks
from tests.fixtures.node_samples import answer


@pytest.mark.parametrize(
    ("word", "known", "expected"),
    [
        ("knwon_hosts", {"known_hosts", "keepalive_s"}, "known_hosts"),
        ("chanel", {"channel", "oncall_channel"}, "channel"),
        ("grace", {"grace_s", "verify_timeout_s"}, "grace_s"),
        ("colour", {"database", "ssh", "nodes"}, None),
        ("", {"a"}, None),
    ],
)
def test_did_you_mean(word: str, known: set[str], expected: str | None) -> None:
    fix = unknown_key("g.toml", f"sec.{word}", known).fix
    assert fix.startswith(f"did you mean sec.{expected}?" if expected else "remove it from g.toml")


@pytest.mark.parametrize(
    ("text", "version", "ok"),
    [
        ("GNU bash, version 4.2.46(2)-release (x86_64-redhat-linux-gnu)", (4, 2), False),
        ("GNU bash, version 4.4.20(1)-release (x86_64-pc-linux-gnu)", (4, 4), True),
        ("GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)", (5, 2), True),
        ("GNU bash, version 3.2.57(1)-release (arm64-apple-darwin23)", (3, 2), False),
        ("zsh 5.9 (x86_64-debian-linux-gnu)", None, False),
    ],
)
def test_bash_versions(text: str, version: tuple[int, int] | None, ok: bool) -> None:
    check = bash_check("n1", text)
    if version:
        assert check.detail.split()[:2] == ["bash", f"{version[0]}.{version[1]}"]
    else:
        assert check.detail.startswith("not GNU")
    assert check.ok is ok
    assert ok or "4.4 or later" in check.fix


def test_no_bash_is_a_failure_with_its_fix() -> None:
    check = bash_check("n1", None)
    assert (check.ok, check.fix) == (False, "install bash 4.4 or later")


NODE = NodeConfig(name="n1", host="10.0.0.1", dev_prefix="/dev/nvidia")


def checks_of(stdout: str, node: NodeConfig = NODE) -> dict[str, Check]:
    return {c.name: c for c in node_checks(node, parse_facts(stdout))}


def test_a_healthy_node_passes_every_check() -> None:
    checks = checks_of(answer())
    assert all(c.ok for c in checks.values()), checks
    assert "0, 1" in checks["device files"].detail


def test_the_script_takes_its_values_as_arguments() -> None:
    argv = doctor_argv(NodeConfig(name="n", host="h", dev_prefix="/x;rm"), timeout_s=10)
    assert argv[:2] == ["sh", "-c"] and "/x;rm" not in argv[2]
    assert argv[4:9] == ["nvidia-smi", "/x;rm", "/proc/driver/nvidia", "-", "10"]


def test_a_cut_answer_is_one_failure() -> None:
    (check,) = node_checks(NODE, parse_facts(answer().replace("@doctor end", "")))
    assert not check.ok


def test_a_missing_fuser_names_psmisc() -> None:
    stdout = answer().replace("@doctor fuser /usr/bin/fuser", "@doctor fuser -")
    check = checks_of(stdout)["fuser"]
    assert not check.ok and "psmisc" in check.fix


def test_no_device_file_under_the_prefix_says_dev_prefix() -> None:
    check = checks_of(answer(dev=""))["device files"]
    assert not check.ok
    assert "dev_prefix" in check.fix and "leaked memory" in check.detail


def test_a_missing_minor_file_names_it() -> None:
    check = checks_of(answer(dev="0"))["device files"]
    assert not check.ok and "/dev/nvidia1" in check.detail


def test_no_driver_minor_says_driver_dir() -> None:
    check = checks_of(answer(minors="0000:18:00.0 0"))["driver minors"]
    assert not check.ok and "0000:2a:00.0" in check.detail and "driver_dir" in check.fix


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"smi-path /usr/bin/nvidia-smi": ""}, None),
        ({"smi-exit 0": "", "smi-exit 124": ""}, "in time"),
        ({"smi": "NVIDIA-SMI has failed", "smi-exit 0": "", "smi-exit 9": ""}, "exit 9"),
    ],
)
def test_nvidia_smi_failures(over: dict[str, str], words: str | None) -> None:
    stdout = answer(**over)
    if not words:
        stdout = stdout.replace("@doctor smi-path /usr/bin/nvidia-smi", "@doctor smi-path -")
    check = checks_of(stdout)["nvidia-smi"]
    assert not check.ok
    assert words is None or words in check.detail


@pytest.mark.parametrize(
    ("uid", "sudo", "options", "ok", "words"),
    [
        (0, False, "rw,relatime", True, "root"),
        (1001, True, "rw,relatime", True, "sudo"),
        (1001, False, "rw,relatime", False, "partial view"),
        (1001, True, "rw,relatime,hidepid=2", False, "hidepid=2"),
        (0, False, "rw,hidepid=invisible", True, "root"),
        (1001, True, "rw,hidepid=0", True, "sudo"),
    ],
)
def test_proc_view(uid: int, sudo: bool, options: str, ok: bool, words: str) -> None:
    check = proc_check("n1", uid, sudo, options)
    assert check.ok is ok and words in check.detail


@pytest.mark.parametrize(
    ("status", "output", "ok", "words"),
    [
        (1, "Error: No such object: 0000", True, "answers"),
        (0, "[]", True, "answers"),
        (124, "", False, "in time"),
        (137, "", False, "in time"),
        (127, "timeout: failed to run command 'docker': No such file", False, "not installed"),
        (1, "sudo: a password is required", False, "refused"),
        (1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock", False, "refused"),
    ],
)
def test_runtime_answers(status: int, output: str, ok: bool, words: str) -> None:
    check = runtime_check("n1", "docker", status, output)
    assert check.ok is ok and words in check.detail


@pytest.mark.parametrize("runtime", ["docker", "podman", "crictl", "slurm"])
def test_runtime_lookups_ask_about_nobody(runtime: str) -> None:
    argv = runtime_argv(runtime, timeout_s=5, sudo=False)
    assert argv[:4] == ["timeout", "-k", "1", "5"]


def test_needed_scopes_follow_the_settings() -> None:
    assert set(needed_scopes(Policy(), idle_dm=False)) == {"commands", "chat:write", "users:read"}
    groups = Policy(approver_groups=("S0ONCALL",), channel="C1", email_local_part=True)
    need = needed_scopes(groups, idle_dm=True)
    assert {"usergroups:read", "users:read.email", "im:write", "channels:history"} <= set(need)


def test_a_token_without_a_scope_it_needs_names_it() -> None:
    need = needed_scopes(Policy(approver_groups=("S0ONCALL",)), idle_dm=False)
    facts = SlackFacts(team="T", user="gpubot", scopes=frozenset({"commands", "chat:write"}))
    by = {c.name: c for c in slack_checks(facts, need)}
    assert by["token valid"].ok and not by["scopes"].ok
    assert "usergroups:read" in by["scopes"].detail and "usergroups:read" in by["scopes"].fix
    assert "users:read" in by["scopes"].fix


def test_an_invalid_token_and_a_missing_channel() -> None:
    (bad,) = slack_checks(SlackFacts(error="invalid_auth"), {})
    assert not bad.ok and "SLACK_BOT_TOKEN" in bad.fix
    facts = SlackFacts(scopes=frozenset({"x"}), channels={"C1": False, "C2": True, "C3": "why"})
    by = {c.name: c for c in slack_checks(facts, {"x": "y"})}
    assert not by["bot in C1"].ok and by["bot in C1"].fix == "/invite @gpubot in C1"
    assert by["bot in C2"].ok and by["bot in C3"].ok


@pytest.mark.parametrize(
    ("facts", "failing"),
    [
        (DbFacts("sqlite://", revision="0005", head="0005"), set()),
        (DbFacts("sqlite://", revision=None, head="0005"), {"migrated"}),
        (DbFacts("sqlite://", revision="0003", head="0005"), {"migrated"}),
        (DbFacts("sqlite://", revision="0005", head="0005", write_error="readonly"), {"writable"}),
        (
            DbFacts("sqlite://", revision="0005", head="0005", keyed=True, keyed_error="set it"),
            {"audit key"},
        ),
        (DbFacts("sqlite://", error="cannot connect"), {"opens"}),
        (DbFacts("sqlite:///gpubot.db", missing="/srv/gpubot.db"), {"exists"}),
        (DbFacts("s", revision="1", head="1", file="/x.db", file_mode=0o600), set()),
        (DbFacts("s", revision="1", head="1", file="/x.db", file_mode=0o644), {"file private"}),
    ],
)
def test_database_checks(facts: DbFacts, failing: set[str]) -> None:
    checks = db_checks(facts)
    assert {c.name for c in checks if not c.ok} == failing
    assert all(c.fix for c in checks if not c.ok)
    if "migrated" in failing:
        assert "gpubot db upgrade" in next(c.fix for c in checks if c.name == "migrated")


def test_rendering_puts_each_fix_under_its_failure() -> None:
    checks = [passed("n1", "auth", "root"), failed("n1", "fuser", "not found", "install psmisc")]
    text = render(checks)
    assert text.splitlines() == [
        "n1:",
        "  ✓ auth: root",
        "  ✗ fuser: not found",
        "      fix: install psmisc",
        "1 passed, 1 failed",
    ]
    doc = as_document(checks)
    assert doc["ok"] is False and doc["checks"][1]["fix"] == "install psmisc"
    assert doc["checks"][0]["fix"] is None


def test_config_lists_every_unknown_key_with_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        '[ssh]\nknwon_hosts = "x"\n[reset]\ngrace = 3\n[[nodes]]\nname = "a"\nhost = "h"\n'
        'dev_prefx = "/dev/nvidia"\n[slack]\nchanel = "C1"\n',
        encoding="utf-8",
    )
    checks, settings = config_checks(path, {})
    bad = {c.name: c.fix for c in checks if not c.ok}
    assert "did you mean ssh.known_hosts?" in bad["key ssh.knwon_hosts"]
    assert "did you mean reset.grace_s?" in bad["key reset.grace"]
    assert "did you mean nodes[0].dev_prefix?" in bad["key nodes[0].dev_prefx"]
    assert "did you mean slack.channel?" in bad["key slack.chanel"]
    assert settings is not None and settings.nodes[0].name == "a"  # the rest still checked
    assert "ssh.known_hosts readable" in bad  # ~/.ssh/known_hosts, the default, is not there


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[ssh\n", "not valid TOML"),
        ("[ssh]\nmax_parallel = -1\n", "ssh.max_parallel"),
    ],
)
def test_config_errors_are_one_failure(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "g.toml"
    path.write_text(text, encoding="utf-8")
    checks, settings = config_checks(path, {})
    assert settings is None and not checks[-1].ok and words in checks[-1].detail


def test_a_short_audit_key_fails(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text("", encoding="utf-8")
    checks, _ = config_checks(path, {"GPUBOT_AUDIT_KEY": "short"})
    assert not {c.name: c for c in checks}["GPUBOT_AUDIT_KEY"].ok


def test_the_last_mount_of_proc_is_the_one_in_effect() -> None:
    facts = parse_facts(answer(mounts="rw,relatime\nrw,relatime,hidepid=invisible"))
    assert facts.proc_options == "rw,relatime,hidepid=invisible"


def test_node_facts_default_to_unknown() -> None:
    assert parse_facts("") == NodeFacts()
