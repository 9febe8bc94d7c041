"""Gpubot against a real single-node Slurm (Debian's 22.05), over SSH on the simulated fleet.

The node lists ``runtimes = ["slurm"]`` and its sessions run this machine's real ``scontrol`` and
``scancel`` (wrappers first on PATH carry ``SLURM_CONF``). Jobs are submitted with ``sbatch`` as
an ordinary test user; a job's process opens a GPU's device file of the node and sleeps, and the
simulator lists it as a compute app (``SimNode.adopt``). Debian's Slurm puts v1 cgroups at
``/slurm_<NodeName>/uid_U/job_J/step_S``: attribution, the job's name and owner come from
there and from ``scontrol show job``; a job whose script starts its GPU process again makes a
reset name ``scancel J``, and ``[reset] stop_workloads = true`` really cancels it.

Self-service stops are of jobs the requesting user submitted: every process of their steps is
that user's.
"""

from __future__ import annotations

import dataclasses
import json
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.cli.render import render_reset
from gpubot.config import Settings
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, ResetService
from gpubot.store import Store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli, reset_fixtures
from tests.fixtures.real_runs import config_with, quick_settings, real_fleet, with_engine
from tests.fixtures.slurm import SlurmCluster
from tests.procs import alive, wait_until


@pytest.fixture(scope="module")
def fleet(
    sim_users: tuple[str, ...],
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimFleet]:
    with real_fleet(tmp_path_factory.mktemp("real-slurm"), ["slurm"], [slurm_cluster.bin_dir]) as f:
        yield f


store = reset_fixtures()[1]


@pytest.fixture(scope="module")
def settings(fleet: SimFleet) -> Settings:
    """Quick resets; lookups may take 10 s on a loaded box."""
    return quick_settings(fleet, None)


@pytest.fixture
def node(fleet: SimFleet, slurm_cluster: SlurmCluster) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    slurm_cluster.cancel_all()  # every job of the test, through Slurm itself
    n.clear()


def holder_script(node: SimNode, gpu: int) -> str:
    """A job that opens GPU ``gpu``'s device file and sleeps."""
    return f"exec 3<>{node.device(gpu)}; exec sleep 1000000"


def respawning_script(node: SimNode, gpu: int) -> str:
    """A job whose script starts its GPU process again whenever it dies."""
    return f"while :; do sh -c '{holder_script(node, gpu)}'; sleep 0.2; done"


def job_on(
    cluster: SlurmCluster, node: SimNode, user: str, gpu: int, name: str, script: str, mib: int
) -> tuple[str, int]:
    """Submit a job as ``user``; return its id and GPU process, once the node lists it."""
    job = cluster.sbatch(user, script, name)
    pid = cluster.holder(job, node.device(gpu))
    node.adopt(pid, gpu, mib)
    return job, pid


def test_status_names_a_real_job(
    fleet: SimFleet,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    alice, bob = sim_users
    job, pid = job_on(slurm_cluster, node, alice, 0, "sweep-lr", holder_script(node, 0), 3000)
    other, opid = job_on(slurm_cluster, node, bob, 1, "eval", holder_script(node, 1), 1000)
    cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    assert f"/slurm_{slurm_cluster.node_name}/uid_" in cgroup  # Debian's MULTIPLE_SLURMD shape
    out = gpubot_cli(fleet.config_path, "status", "node1")
    assert out.returncode == 0, out.stderr
    assert f"{alice} {pid} 3000 MiB slurm:{job}.batch" in out.stdout
    assert f"{bob} {opid} 1000 MiB slurm:{other}.batch" in out.stdout
    doc = json.loads(gpubot_cli(fleet.config_path, "status", "node1", "--json").stdout)
    procs = {q["pid"]: q for n in doc["nodes"] for g in n["gpus"] for q in g["processes"]}
    w = procs[pid]["workload"]
    assert (w["kind"], w["id"], w["name"], w["owner"]) == ("slurm", job, "sweep-lr", alice)
    assert w["detail"]["user"] == alice and w["detail"]["step"] == "batch"
    assert w["detail"]["uid"] == str(pwd.getpwnam(alice).pw_uid)  # from the cgroup path
    assert procs[opid]["workload"]["owner"] == bob


async def test_the_job_owner_decides_self_service(
    settings: Settings,
    store: Store,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
) -> None:
    alice, bob = sim_users
    job, pid = job_on(slurm_cluster, node, alice, 0, "mine", holder_script(node, 0), 2000)

    async def plans(eng: ResetService) -> list[Any]:
        return [
            (await eng.plan(ResetRequest("node1", who, gpus=(0,), min_uid=1000)))[0]
            for who in (alice, bob)
        ]

    mine, bobs = await with_engine(settings, store, plans)
    assert [(t.pid, t.owner, t.forced) for t in mine.targets] == [(pid, alice, False)]
    assert mine.targets[0].reasons[0] == (
        f"kills Slurm job {job} step batch (user `{alice}`, job name `mine`)"
    )
    assert bobs.forced  # bob's request for alice's job needs an approval


def test_a_job_that_starts_its_process_again_names_scancel(
    fleet: SimFleet,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    alice, _ = sim_users
    job, pid = job_on(slurm_cluster, node, alice, 2, "looper", respawning_script(node, 2), 2500)
    cfg = config_with(fleet, tmp_path)  # stop_workloads is off: advice only
    assert gpubot_cli(cfg, "db", "upgrade").returncode == 0
    out = gpubot_cli(cfg, "reset", "node1", "--gpu", "2", "--yes", "--force", "--json")
    doc = json.loads(out.stdout)
    (g,) = doc["gpus"]
    assert g["outcome"] == "respawned", out.stdout + out.stderr
    assert f"Slurm job {job}" in g["detail"] and f"stop it with `scancel {job}`" in g["detail"]
    assert not [s for s in doc["steps"] if s["kind"] == "stop_workload"]
    assert not alive(pid) and slurm_cluster.state(job) == "RUNNING"  # the script went on
    text = gpubot_cli(cfg, "reset", "node1", "--gpu", "2", "--yes", "--force")
    assert "GPU 2: respawned" in text.stdout and f"`scancel {job}`" in text.stdout


async def test_stop_workloads_really_cancels_the_job(
    settings: Settings,
    store: Store,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
) -> None:
    alice, _ = sim_users
    job, _ = job_on(slurm_cluster, node, alice, 3, "cancelme", respawning_script(node, 3), 2500)
    s = dataclasses.replace(
        settings, reset=dataclasses.replace(settings.reset, stop_workloads=True)
    )

    async def reset(eng: ResetService) -> Any:
        plan, before = await eng.plan(ResetRequest("node1", alice, gpus=(3,), min_uid=1000))
        assert not plan.forced  # alice's own job: self-service
        return await eng.execute(plan, Ask.by(alice, "test", "t"), before=before)

    result = await with_engine(s, store, reset)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED], render_reset(result)
    cmd = f"scancel {job}"
    stops = [x.data for x in result.steps if x.kind == "stop_workload"]
    assert [(x["command"], x["result"]) for x in stops] == [(cmd, "running"), (cmd, "done")]
    deadline = time.monotonic() + 20
    while slurm_cluster.state(job) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slurm_cluster.state(job) == "CANCELLED"  # really cancelled, script and all
    doc = json.loads(json.dumps(result.to_dict(), default=str))
    assert [(x["command"], x["result"]) for x in doc["steps"] if x["kind"] == "stop_workload"] == [
        (cmd, "running"),
        (cmd, "done"),
    ]
    assert "GPU 3: freed" in render_reset(result)
    assert result.action_id is not None
    detail = await store.action(result.action_id)
    assert detail is not None
    logged = [
        e
        for e in json.loads(json.dumps(detail.as_dict(), default=str))["events"]
        if e.get("kind") == "stop_workload"
    ]
    assert [(e["command"], e["result"]) for e in logged] == [(cmd, "running"), (cmd, "done")]
    wait_until(lambda: node.state()["gpus"][3]["memory_used_mib"] == 0, 10, "GPU 3 freed")
