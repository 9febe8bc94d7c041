"""Who really holds a GPU, on the simulated fleet: workloads in real cgroups, named by the node's
stand-in docker/podman/scontrol/crictl over SSH, owners deciding self-service, respawning
containers and the command that stops them, and lookups that time out.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import AttributionSettings, Settings, load
from gpubot.core.models import NodeSnapshot, Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, NodeLocks, ResetResult, ResetService
from gpubot.services.status import StatusService
from gpubot.store import Store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli, reset_fixtures
from tests.fixtures.slack import FakeSlack, running_bot, slack_settings_for
from tests.procs import alive


@pytest.fixture(scope="module")
def fleet(
    cgroups_ok: None, sim_users: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("workloads"), nodes=1, gpus=4, runtimes=True, release_delay_s=0.2
    ) as f:
        yield f


store, engine = reset_fixtures(grace_s=1.0, verify_timeout_s=4.0)[1:3]


@pytest.fixture(scope="module")
def settings(fleet: SimFleet) -> Settings:
    """The fleet's settings, quick resets, and a container's ``owner`` label names its user."""
    s = load(fleet.config_path)
    reset = dataclasses.replace(s.reset, grace_s=1.0, verify_timeout_s=4.0, poll_interval_s=0.2)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=15.0)
    return dataclasses.replace(
        s, reset=reset, ssh=ssh, attribution=AttributionSettings("owner", 3.0)
    )


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.clear()  # kills by pid what the test left, removes its cgroups, empties the registry


def labelled_config(fleet: SimFleet, tmp: Path, **reset: Any) -> Path:
    """The fleet's settings file plus ``[attribution] container_owner_label = "owner"``."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in reset.items())
    text = fleet.config_path.read_text() + '\n[attribution]\ncontainer_owner_label = "owner"\n'
    path = tmp / "gpubot.toml"
    path.write_text(text.replace("[reset]\n", "[reset]\n" + extra, 1) if extra else text)
    return path


def only(snap: NodeSnapshot, pid: int) -> Any:
    (p,) = [p for p in snap.processes if p.pid == pid]
    return p


async def test_status_attributes_each_kind(
    engine: ResetService,
    fleet: SimFleet,
    node: SimNode,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    alice, bob = sim_users
    d = node.spawn(
        gpu=0,
        mib=3000,
        cgroup="docker",
        container_name="train-llama",
        image="pytorch:24.05",
        labels={"owner": alice},
    )
    p = node.spawn(gpu=1, mib=1000, cgroup="podman", container_name="infer", image="vllm:0.5")
    k = node.spawn(gpu=2, mib=1000, cgroup="kubernetes", pod="research/llama-0")
    s = node.spawn(gpu=3, mib=1000, cgroup="slurm", job_name="sweep-lr", job_user=bob)
    svc = node.spawn(gpu=3, mib=500, cgroup="service")
    sess = node.spawn(gpu=2, mib=500, cgroup="session", user=alice)
    snap = await engine.status.snapshot(engine.status.node("node1"))
    got = {w.pid: only(snap, w.pid).workload for w in (d, p, k, s, svc, sess)}
    assert {pid: (w.kind, w.id) for pid, w in got.items()} == {
        d.pid: ("docker", d.container_id),
        p.pid: ("podman", p.container_id),
        k.pid: ("kubernetes", k.container_id),
        s.pid: ("slurm", s.job_id),
        svc.pid: ("service", svc.unit),
        sess.pid: ("session", sess.unit),
    }
    # Names from the stand-ins, over SSH; owners from what root controls.
    assert (got[d.pid].name, got[d.pid].owner, got[d.pid].get("image")) == (
        "train-llama",
        alice,
        "pytorch:24.05",
    )
    assert (got[p.pid].name, got[p.pid].owner) == ("infer", "root")  # no owner label
    assert (got[k.pid].name, got[k.pid].get("namespace")) == ("research/llama-0", "research")
    assert (got[s.pid].name, got[s.pid].owner, got[s.pid].get("step")) == ("sweep-lr", bob, "0")
    assert got[svc.pid].owner is None and got[sess.pid].owner is None
    assert only(snap, d.pid).user == "root"  # the process itself is root's: its owner is alice

    cfg = labelled_config(fleet, tmp_path)
    out = gpubot_cli(cfg, "status", "node1")
    assert out.returncode == 0, out.stderr
    assert f"{alice} {d.pid} 3000 MiB docker:train-llama" in out.stdout
    assert f"{bob} {s.pid} 1000 MiB slurm:{s.job_id}.0" in out.stdout
    doc = json.loads(gpubot_cli(cfg, "status", "node1", "--json").stdout)
    procs = {q["pid"]: q for n in doc["nodes"] for g in n["gpus"] for q in g["processes"]}
    assert procs[d.pid]["workload"] == {
        "kind": "docker",
        "id": d.container_id,
        "name": "train-llama",
        "owner": alice,
        "detail": {"image": "pytorch:24.05", "label.owner": alice, "restart": "no"},
    }
    assert procs[s.pid]["workload"]["kind"] == "slurm"
    assert procs[s.pid]["workload"]["detail"]["user"] == bob
    assert procs[sess.pid]["workload"]["owner"] is None


async def plan_of(engine: ResetService, requester: str, gpu: int) -> Any:
    plan, before = await engine.plan(ResetRequest("node1", requester, gpus=(gpu,), min_uid=1000))
    return plan, before


async def test_owners_decide_self_service(
    engine: ResetService, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    job = node.spawn(gpu=0, mib=2000, cgroup="slurm", job_name="sweep-lr", job_user=alice)
    mine = node.spawn(
        gpu=1, mib=2000, cgroup="docker", container_name="mine", labels={"owner": alice}
    )
    root_c = node.spawn(gpu=2, mib=2000, cgroup="docker", container_name="nobodys")
    plan, _ = await plan_of(engine, alice, 0)
    assert [(t.pid, t.owner, t.forced) for t in plan.targets] == [(job.pid, alice, False)]
    assert plan.targets[0].reasons[0] == (
        f"kills Slurm job {job.job_id} step 0 (user `{alice}`, job name `sweep-lr`)"
    )
    plan, _ = await plan_of(engine, bob, 0)
    assert plan.forced  # bob's request for alice's job needs approval
    plan, _ = await plan_of(engine, alice, 1)
    assert [(t.pid, t.owner, t.forced) for t in plan.targets] == [(mine.pid, alice, False)]
    plan, before = await plan_of(engine, alice, 2)
    assert [(t.pid, t.owner, t.forced) for t in plan.targets] == [(root_c.pid, "root", True)]
    # alice frees her own container's GPU at once: only its process dies.
    plan, before = await plan_of(engine, alice, 1)
    result = await engine.execute(plan, Ask.by("alice", "test", "t"), before=before)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    assert not alive(mine.pid) and alive(job.pid) and alive(root_c.pid)


async def test_slack_runs_a_labelled_container_at_once_and_asks_for_an_unlabelled_one(
    fleet: SimFleet, node: SimNode, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    owner = "nobody"  # U0OWNER's Linux user in the Slack tables
    s = slack_settings_for(fleet.config_path, owner)
    s = dataclasses.replace(s, attribution=AttributionSettings("owner", 3.0))
    mine = node.spawn(
        gpu=0, mib=2000, cgroup="docker", container_name="nb", labels={"owner": owner}
    )
    other = node.spawn(gpu=1, mib=2000, cgroup="docker", container_name="shared")
    async with running_bot(s, fake_slack, f"sqlite:///{tmp_path}/audit.db") as h:
        assert (await h.send.command("reset node1 gpu 0", user="U0OWNER")).status == 200
        await h.settle()
        assert not alive(mine.pid)
        assert not [c for c in fake_slack.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        assert (await h.send.command("reset node1 gpu 1", user="U0OWNER")).status == 200
        await h.settle()
        (req,) = [c for c in fake_slack.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        said = json.dumps(req.body)
        assert "container `shared`" in said and "root" in said
        assert alive(other.pid)


async def test_a_respawning_container_names_docker_stop(
    engine: ResetService, node: SimNode
) -> None:
    c = node.spawn(gpu=3, mib=2500, cgroup="docker", container_name="trainer", restart="always")
    plan, before = await plan_of(engine, "root", 3)
    result = await engine.execute(plan, Ask.by("t", "test", "t"), before=before)
    (g,) = result.gpus
    assert g.outcome is Outcome.RESPAWNED
    assert "container `trainer`" in g.detail and "stop it with `docker stop trainer`" in g.detail
    assert not [s for s in result.steps if s.kind == "stop_workload"]  # advice only by default
    assert c.current_pid() is not None  # the restart policy brought it back


async def test_stop_workloads_stops_the_container_audited(
    settings: Settings, store: Store, node: SimNode
) -> None:
    s = dataclasses.replace(
        settings, reset=dataclasses.replace(settings.reset, stop_workloads=True)
    )
    transport = make_transport(s.ssh)
    try:
        eng = ResetService(s, transport, store, StatusService(s, transport, store), NodeLocks())
        c = node.spawn(
            gpu=3, mib=2500, cgroup="docker", container_name="trainer2", restart="always"
        )
        plan, before = await plan_of(eng, "root", 3)
        result: ResetResult = await eng.execute(plan, Ask.by("t", "test", "t"), before=before)
    finally:
        await transport.close()
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    stops = [s.data for s in result.steps if s.kind == "stop_workload"]
    assert [(x["command"], x["result"]) for x in stops] == [
        ("docker stop trainer2", "running"),
        ("docker stop trainer2", "done"),
    ]
    assert c.current_pid() is None and not c.alive()
    assert result.action_id is not None
    detail = await store.action(result.action_id)  # the audit log holds the same steps
    assert detail is not None
    logged = [
        e
        for e in json.loads(json.dumps(detail.as_dict(), default=str))["events"]
        if e.get("kind") == "stop_workload"
    ]
    assert [e["result"] for e in logged] == ["running", "done"]


async def test_a_lookup_that_times_out_still_gives_a_status(
    engine: ResetService, node: SimNode
) -> None:
    c = node.spawn(gpu=0, mib=1000, cgroup="docker", container_name="slow")
    node.set_runtime_delay(30.0)  # the stand-ins hang far past lookup_timeout_s (3 s)
    try:
        started = time.monotonic()
        snap = await engine.status.snapshot(engine.status.node("node1"))
        took = time.monotonic() - started
    finally:
        node.set_runtime_delay(0.0)
    w = only(snap, c.pid).workload
    assert (w.kind, w.id, w.name, w.get("name_unknown")) == ("docker", c.container_id, None, "yes")
    assert w.owner == "root" and took < 15
    gpu0 = snap.gpu(0)
    assert gpu0 is not None and gpu0.memory_used_mib == 1000
