"""``gpubot doctor`` on the simulated fleet (real SSH), healthy and with each fault injected:
an unknown host key, a sudo rule too wide and too narrow, no ``fuser``, an old bash, a wrong
``dev_prefix``, a runtime that hangs, a Slack token without ``usergroups:read``, an unmigrated
database. Each is named with its fix; every other node still passes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.transport.sshlib import asyncssh
from gpusim.fleet import SimFleet
from gpusim.sudoers import readme_sudo_rule
from tests.fixtures.slack import BOT_TOKEN, FakeSlack

README = Path(__file__).resolve().parents[2] / "README.md"
RULE = readme_sudo_rule(README)
SCRUBBED = ("GPUBOT_CONFIG", "GPUBOT_AUDIT_KEY", "SLACK_BOT_TOKEN", "SLACK_API_URL")


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    return {**env, **extra}


def doctor(config: Path, *args: str, text: bool = False) -> tuple[int, dict[str, Any], str]:
    """Run ``gpubot doctor --json``; return its exit status, its document and (``text``: run
    again without ``--json``, with the same exit status) its text, else ""."""
    base = [sys.executable, "-m", "gpubot", "--config", str(config), "doctor", *args]
    doc = subprocess.run([*base, "--json"], capture_output=True, text=True, env=environ())
    assert "Traceback" not in doc.stderr
    if not text:
        return doc.returncode, json.loads(doc.stdout), ""
    shown = subprocess.run(base, capture_output=True, text=True, env=environ())
    assert "Traceback" not in shown.stderr and doc.returncode == shown.returncode
    return doc.returncode, json.loads(doc.stdout), shown.stdout


def failures(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["area"], c["check"]): c for c in doc["checks"] if not c["ok"]}


def write_config(fleet: SimFleet, name: str, text: str) -> Path:
    path = fleet.config_path.with_name(name)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    """Two sudo nodes with the README's rule and the runtime stand-ins, migrated."""
    with SimFleet(
        tmp_path_factory.mktemp("doctor"), nodes=2, gpus=2, sudo_rule=RULE, runtimes=True
    ) as f:
        write_config(f, "gpubot.toml", f.config_path.read_text() + LOOKUP)
        cmd = [sys.executable, "-m", "gpubot", "--config", str(f.config_path), "db", "upgrade"]
        subprocess.run(cmd, check=True, capture_output=True, env=environ())
        yield f


LOOKUP = "\n[attribution]\nlookup_timeout_s = 1\n"


def test_a_healthy_fleet_passes(fleet: SimFleet) -> None:
    code, doc, text = doctor(fleet.config_path, text=True)
    assert (code, failures(doc)) == (0, {})
    names = {c["check"] for c in doc["checks"] if c["area"] == "node2"}
    assert {"host key", "sudo rule", "fuser", "bash >= 4.4", "device files"} <= names
    assert {"runtime docker", "runtime slurm", "/proc view"} <= names
    assert "✗" not in text and text.rstrip().endswith(f"{len(doc['checks'])} passed, 0 failed")


def test_an_unknown_host_key_prints_the_fingerprint(fleet: SimFleet) -> None:
    lines = fleet.known_hosts.read_text().splitlines(keepends=True)
    port1 = fleet.node("node1").port
    known = fleet.known_hosts.with_name("known_hosts.doctor")
    known.write_text("".join(ln for ln in lines if f":{port1} " not in ln))
    config = write_config(
        fleet,
        "unknown-key.toml",
        fleet.config_path.read_text().replace(str(fleet.known_hosts), str(known)),
    )
    code, doc, text = doctor(config, text=True)
    key = asyncssh.read_public_key(str(fleet.node("node1").dir / "ssh_host_ed25519_key.pub"))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "host key")]
    check = bad[("node1", "host key")]
    assert "unknown" in check["detail"] and key.get_fingerprint() in check["detail"]
    assert f"ssh-keyscan -p {port1} 127.0.0.1 >> {known}" in check["fix"]
    assert "fix: check that fingerprint" in text


def test_a_changed_host_key_prints_the_fingerprint(fleet: SimFleet) -> None:
    port1, port2 = fleet.node("node1").port, fleet.node("node2").port
    lines = fleet.known_hosts.read_text().splitlines(keepends=True)
    (node2,) = [ln for ln in lines if f":{port2} " in ln]
    known = fleet.known_hosts.with_name("known_hosts.changed")
    known.write_text(node2.replace(f":{port2} ", f":{port1} ") + node2)  # node1 pinned wrong
    config = write_config(
        fleet,
        "changed-key.toml",
        fleet.config_path.read_text().replace(str(fleet.known_hosts), str(known)),
    )
    code, doc, _ = doctor(config)
    key = asyncssh.read_public_key(str(fleet.node("node1").dir / "ssh_host_ed25519_key.pub"))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "host key")]
    check = bad[("node1", "host key")]
    assert "CHANGED" in check["detail"] and key.get_fingerprint() in check["detail"]
    assert f"ssh-keygen -R '[127.0.0.1]:{port1}' -f {known}" in check["fix"]


def test_a_wrong_dev_prefix_is_named(fleet: SimFleet) -> None:
    node = fleet.node("node1")
    text = fleet.config_path.read_text().replace(
        f'dev_prefix = "{node.dev_prefix}"', 'dev_prefix = "/nonexistent/nvidia"', 1
    )
    code, doc, _ = doctor(write_config(fleet, "dev-prefix.toml", text))
    bad = failures(doc)
    assert code == 1 and ("node1", "device files") in bad and ("node2", "device files") not in bad
    assert "dev_prefix" in bad[("node1", "device files")]["fix"]
    # The node's rule names its real device files, not the configured ones: said too.
    assert "fuser -v" in bad[("node1", "sudo rule")]["detail"]


def test_a_hanging_runtime_is_a_failure_not_a_hang(fleet: SimFleet) -> None:
    node = fleet.node("node1")
    node.set_runtime_delay(30)
    try:
        code, doc, _ = doctor(fleet.config_path, "node1")
    finally:
        node.set_runtime_delay(0)
    bad = failures(doc)
    assert code == 1 and ("node1", "runtime docker") in bad
    assert "did not answer in time" in bad[("node1", "runtime docker")]["detail"]
    assert "lookup_timeout_s" in bad[("node1", "runtime docker")]["fix"]
    assert not any(area == "node2" for area, _ in bad)  # only node1 was asked


def test_an_unmigrated_database(fleet: SimFleet, tmp_path: Path) -> None:
    (tmp_path / "fresh.db").touch(mode=0o600)  # empty: the doctor never creates one itself
    url = "sqlite:///" + str(tmp_path / "fresh.db")
    text = fleet.config_path.read_text().replace(
        f'url = "sqlite:///{fleet.root / "gpubot.db"}"', f'url = "{url}"'
    )
    assert url in text
    code, doc, _ = doctor(write_config(fleet, "fresh-db.toml", text))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("database", "migrated")]
    assert bad[("database", "migrated")]["fix"] == "run `gpubot db upgrade`"


SLACK = '\n[slack]\nchannel = "C0ALERTS"\n\n[approvals]\nusergroup = "S0ONCALL"\n'


@pytest.mark.parametrize("granted", ["all", "no-usergroups", "not-in-channel"])
async def test_slack_scopes(fleet: SimFleet, fake_slack: FakeSlack, granted: str) -> None:
    if granted == "no-usergroups":
        fake_slack.scopes.remove("usergroups:read")
    if granted == "not-in-channel":
        fake_slack.members = set()
    config = write_config(fleet, "slack.toml", fleet.config_path.read_text() + SLACK)
    env = environ(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_API_URL=fake_slack.base_url)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "gpubot", "--config", str(config), "doctor", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert b"Traceback" not in err
    doc = json.loads(out)
    slack = {c["check"]: c for c in doc["checks"] if c["area"] == "slack"}
    assert slack["token valid"]["ok"]
    if granted == "all":
        assert (proc.returncode, failures(doc)) == (0, {})
    elif granted == "not-in-channel":
        assert proc.returncode == 1 and list(failures(doc)) == [("slack", "bot in C0ALERTS")]
        assert slack["bot in C0ALERTS"]["fix"] == "/invite @gpubot in C0ALERTS"
    else:
        assert proc.returncode == 1 and list(failures(doc)) == [("slack", "scopes")]
        assert "usergroups:read" in slack["scopes"]["detail"]
        assert "add usergroups:read" in slack["scopes"]["fix"]


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (RULE.replace("/usr/bin/kill -s TERM [0-9]*", "/usr/bin/kill"), "too wide"),
        (RULE.replace(", GPUBOT_KILL,", ","), "too narrow"),
    ],
    ids=["too-wide", "too-narrow"],
)
def test_a_sudo_rule_that_is_not_the_readmes(
    fleet_factory: Callable[..., SimFleet], rule: str, words: str
) -> None:
    assert rule != RULE
    f = fleet_factory(nodes=1, gpus=1, sudo_rule=rule)
    code, doc, _ = doctor(migrated(f))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "sudo rule")]
    assert words in bad[("node1", "sudo rule")]["detail"]
    assert "kill" in bad[("node1", "sudo rule")]["detail"]


def migrated(f: SimFleet) -> Path:
    cmd = [sys.executable, "-m", "gpubot", "--config", str(f.config_path), "db", "upgrade"]
    subprocess.run(cmd, check=True, capture_output=True, env=environ())
    return f.config_path


OLD_BASH = """#!/bin/sh
# An old bash, as RHEL 7 has: only its version differs from this machine's.
if [ "$1" = --version ]; then
  echo 'GNU bash, version 4.2.46(2)-release (x86_64-redhat-linux-gnu)'; exit 0
fi
exec /bin/bash "$@"
"""


def test_an_old_bash_is_named(fleet_factory: Callable[..., SimFleet], tmp_path: Path) -> None:
    stand_in = tmp_path / "old-bash"
    stand_in.mkdir()
    (stand_in / "bash").write_text(OLD_BASH)
    (stand_in / "bash").chmod(0o755)
    f = fleet_factory(nodes=1, gpus=1, session_path=[str(stand_in)])
    code, doc, _ = doctor(migrated(f))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "bash >= 4.4")]
    assert "bash 4.2" in bad[("node1", "bash >= 4.4")]["detail"]
    assert "4.4 or later" in bad[("node1", "bash >= 4.4")]["fix"]


def test_a_node_without_fuser(fleet_factory: Callable[..., SimFleet]) -> None:
    if any(os.access(p, os.X_OK) for p in ("/usr/sbin/fuser", "/sbin/fuser")):
        pytest.skip("fuser is in sbin here: the probe's PATH (and the doctor's) adds sbin")
    f = fleet_factory(nodes=1, gpus=1, without=["fuser"])
    code, doc, _ = doctor(migrated(f))
    bad = failures(doc)
    assert code == 1 and ("node1", "fuser") in bad
    assert "psmisc" in bad[("node1", "fuser")]["fix"]
    # Without sudo and as root the rest is fine: only fuser is missing.
    assert list(bad) == [("node1", "fuser")]


@pytest.mark.parametrize("hidepid", [False, True], ids=["plain-proc", "hidepid"])
def test_a_partial_view_of_proc_is_named(
    fleet_factory: Callable[..., SimFleet], sim_users: tuple[str, ...], hidepid: bool
) -> None:
    f = fleet_factory(nodes=1, gpus=1, view_user=sim_users[1], hidepid=hidepid)
    code, doc, _ = doctor(migrated(f))
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "/proc view")]
    check = bad[("node1", "/proc view")]
    if hidepid:
        assert "mounted hidepid=" in check["detail"] and "hidepid" in check["fix"]
    else:
        assert "partial view" in check["detail"] and "sudo = true" in check["fix"]


def test_a_refused_key_and_an_unreachable_node_each_fail_alone(
    fleet: SimFleet, tmp_path: Path
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    other.write_private_key(str(tmp_path / "other_key"))
    text = fleet.config_path.read_text()
    first = text.index(f'key = "{fleet.client_key}"')  # node1's
    rest = text[first:].split("\n", 1)[1]
    text = text[:first] + f'key = "{tmp_path / "other_key"}"\n' + rest
    config = write_config(fleet, "auth.toml", text)
    fleet.stop_server("node2")
    try:
        code, doc, _ = doctor(config)
    finally:
        fleet.start_server("node2")
    bad = failures(doc)
    assert code == 1 and list(bad) == [("node1", "auth"), ("node2", "reachable")]
    assert "authorized_keys" in bad[("node1", "auth")]["fix"]
    assert "runs sshd" in bad[("node2", "reachable")]["fix"]


def test_a_keyed_log_without_its_key(fleet: SimFleet, tmp_path: Path) -> None:
    url = "sqlite:///" + str(tmp_path / "keyed.db")
    text = fleet.config_path.read_text().replace(
        f'url = "sqlite:///{fleet.root / "gpubot.db"}"', f'url = "{url}"'
    )
    config = write_config(fleet, "keyed.toml", text)
    keyed = environ(GPUBOT_AUDIT_KEY="k" * 32)
    for args in (["db", "upgrade"], ["status", "node1"]):  # status records a (keyed) query
        cmd = [sys.executable, "-m", "gpubot", "--config", str(config), *args]
        subprocess.run(cmd, check=True, capture_output=True, env=keyed)
    code, doc, _ = doctor(config)
    bad = failures(doc)
    assert code == 1 and list(bad) == [("database", "audit key")]
    assert "keyed" in bad[("database", "audit key")]["detail"]
    assert "GPUBOT_AUDIT_KEY" in bad[("database", "audit key")]["fix"]


def test_a_database_file_others_can_read(fleet: SimFleet, tmp_path: Path) -> None:
    db = fleet.root / "gpubot.db"
    before = db.stat().st_mode
    db.chmod(0o644)
    try:
        code, doc, _ = doctor(fleet.config_path, "node1")
    finally:
        db.chmod(before)
    bad = failures(doc)
    assert code == 1 and list(bad) == [("database", "file private")]
    assert bad[("database", "file private")]["fix"] == f"chmod 600 {db}"
