"""``gpubot doctor`` on a Slurm node of the real one-node Slurm 22.05 with accounting and
slurmrestd (issue 36): the scheduler answers over SSH and through slurmrestd, and the drain
rights of gpubot's account are named in one line. The account without rights is alice (a
simulated node whose sessions log in as her): the verdict is checked against what the real
``scontrol update`` does as her (the control), then read again after
``sacctmgr modify user alice set adminlevel=operator``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.daemons import SYSTEM_PATH, need
from tests.fixtures.slurm import SlurmCluster

CHECKS = ("Slurm clients (sinfo, squeue)", "Slurm drain rights", "slurmrestd")


def doctor(fleet: SimFleet, c: SlurmCluster, token: str) -> dict[str, dict[str, Any]]:
    """Run ``gpubot doctor --json`` with node1 a Slurm node and the cluster's slurmrestd; return
    node1's Slurm checks by name."""
    text = fleet.config_path.read_text()
    text, n = re.subn(
        r'(?m)^name = "node1"$',
        f'name = "node1"\nscheduler = "slurm"\nslurm_node = "{c.node_name}"',
        text,
    )
    assert n == 1
    text += f'\n[slurm]\nrestd_url = "{c.restd_url}"\nrestd_user = "root"\n'
    path = fleet.config_path.with_name("doctor-slurm.toml")
    path.write_text(text)
    argv = [sys.executable, "-m", "gpubot", "--config", str(path), "doctor", "--json", "node1"]
    env = {"PATH": SYSTEM_PATH, "SLURM_JWT": token, "PYTHONPATH": ":".join(sys.path)}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    doc = json.loads(p.stdout)
    return {c["check"]: c for c in doc["checks"] if c["area"] == "node1" and c["check"] in CHECKS}


def scontrol_update_as(c: SlurmCluster, user: str, state: str) -> subprocess.CompletedProcess[str]:
    """The control: what slurmctld answers ``user``'s own ``scontrol update`` of the node."""
    argv = [
        "setpriv",
        f"--reuid={user}",
        f"--regid={user}",
        "--init-groups",
        need("scontrol", "slurm-wlm"),
        "update",
        f"NodeName={c.node_name}",
        f"State={state}",
        *(["Reason=gpubot doctor test"] if state == "DRAIN" else []),
    ]
    env = {"PATH": SYSTEM_PATH, **c.env}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)


def sacctmgr_level(c: SlurmCluster, user: str, level: str) -> None:
    c.cli("-i", "modify", "user", user, "set", f"adminlevel={level}", program=need("sacctmgr", ""))


@pytest.fixture
def alice_fleet(
    fleet_factory: Callable[..., SimFleet], slurm_accounting: SlurmCluster, sim_users: Any
) -> Iterator[SimFleet]:
    yield fleet_factory(
        nodes=1,
        gpus=4,
        view_user=sim_users[0],
        runtimes=["slurm"],
        session_path=[str(slurm_accounting.bin_dir)],
    )
    sacctmgr_level(slurm_accounting, sim_users[0], "none")


def test_root_may_drain_and_the_scheduler_answers_both_ways(
    fleet_factory: Callable[..., SimFleet], slurm_accounting: SlurmCluster
) -> None:
    c = slurm_accounting
    f = fleet_factory(nodes=1, gpus=4, runtimes=["slurm"], session_path=[str(c.bin_dir)])
    checks = doctor(f, c, c.token("root"))
    assert {n: x["ok"] for n, x in checks.items()} == dict.fromkeys(CHECKS, True), checks
    assert checks["Slurm drain rights"]["detail"] == "root: Slurm lets it scontrol update"
    assert "(v0.0.38)" in checks["slurmrestd"]["detail"]
    assert checks["Slurm clients (sinfo, squeue)"]["detail"].startswith(
        f"answer; Slurm holds {c.node_name}"
    )

    bad = doctor(f, c, c.token("root")[:-4] + "AAAA")  # a token slurmctld refuses
    assert bad["slurmrestd"]["ok"] is False and "HTTP 500" in bad["slurmrestd"]["detail"]
    assert "renew the JWT for root" in bad["slurmrestd"]["fix"]


def test_an_account_without_a_role_is_named_and_an_operator_passes(
    alice_fleet: SimFleet, slurm_accounting: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    c, alice = slurm_accounting, sim_users[0]
    checks = doctor(alice_fleet, c, c.token("root"))
    rights = checks["Slurm drain rights"]
    assert checks["Slurm clients (sinfo, squeue)"]["ok"] is True  # she may read
    assert rights["ok"] is False
    assert rights["detail"] == f"scontrol update would be refused: {alice} has AdminLevel=None"
    assert rights["fix"].startswith(f"sacctmgr -i modify user {alice} set adminlevel=operator")
    refused = scontrol_update_as(c, alice, "DRAIN")
    assert refused.returncode != 0, refused  # the control: Slurm does refuse her
    assert c.idle()

    sacctmgr_level(c, alice, "operator")
    checks = doctor(alice_fleet, c, c.token("root"))
    rights = checks["Slurm drain rights"]
    assert rights["ok"] is True
    assert rights["detail"] == f"{alice} has AdminLevel=Operator (sacctmgr)"
    # Not checked here: that slurmctld then takes her update. In this fixture it still said
    # "Invalid user id" 30 s after sacctmgr's change (slurmdbd's push to slurmctld not seen).
