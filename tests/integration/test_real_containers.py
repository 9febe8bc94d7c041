"""Gpubot against a real Docker engine and a real rootful podman, over SSH on the simulated fleet.

The node lists ``runtimes = ["docker", "podman"]`` and its sessions run this machine's real
``docker`` and ``podman`` (wrappers first on PATH point them at the fixtures' own daemon and
storage). Each container is busybox with the node's device folder bind-mounted: its process
opens a GPU's device file and sleeps, and the simulator lists it as a compute app
(``SimNode.adopt``). Attribution, names, owners and restart policies come from the real
cgroups and ``inspect``; a reset of a restarting container names ``docker stop NAME`` (or
``podman stop NAME``), and ``[reset] stop_workloads = true`` really stops it.

Self-service stops use containers run with ``--user`` of the requesting user: every process of
such a container is that user's, so they hold under the rule that a stop runs only then.
"""

from __future__ import annotations

import dataclasses
import json
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
from tests.fixtures.real_runs import (
    config_with,
    procs_of,
    quick_settings,
    real_fleet,
    with_engine,
)
from tests.fixtures.runtimes import ContainerEngine, DockerEngine, PodmanEngine
from tests.procs import alive, wait_until

KINDS = ("docker", "podman")
IMAGES = {"docker": "gpusim-busybox:1", "podman": "localhost/gpusim-busybox:1"}


@pytest.fixture(scope="module")
def fleet(
    sim_users: tuple[str, ...],
    docker_engine: DockerEngine,
    podman_engine: PodmanEngine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimFleet]:
    path = [docker_engine.bin_dir, podman_engine.bin_dir]
    with real_fleet(tmp_path_factory.mktemp("real-containers"), KINDS, path) as f:
        yield f


store = reset_fixtures()[1]


@pytest.fixture(scope="module")
def settings(fleet: SimFleet) -> Settings:
    """Quick resets; a container's ``owner`` label names its user; lookups may take 10 s."""
    return quick_settings(fleet, "owner")


@pytest.fixture(params=KINDS)
def rt(request: pytest.FixtureRequest) -> ContainerEngine:
    """Each test runs once against the real Docker engine and once against podman."""
    engine: ContainerEngine = request.getfixturevalue(f"{request.param}_engine")
    return engine


@pytest.fixture
def node(fleet: SimFleet, rt: ContainerEngine) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    rt.remove_all()  # every container of the test, through the runtime itself
    n.clear()


def test_status_names_real_containers(
    fleet: SimFleet,
    node: SimNode,
    rt: ContainerEngine,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    alice, _ = sim_users
    kind = rt.kind
    mine = rt.run_gpu(
        f"{kind}-train", node, 0, user=alice, labels={"owner": alice}, restart="always"
    )
    shared = rt.run_gpu(f"{kind}-shared", node, 1)  # root's, no label, no restart policy
    node.adopt(mine.pid, 0, 3000)
    node.adopt(shared.pid, 1, 1000)
    cfg = config_with(fleet, tmp_path, owner_label=True)
    out = gpubot_cli(cfg, "status", "node1")
    assert out.returncode == 0, out.stderr
    assert f"{alice} {mine.pid} 3000 MiB {kind}:{kind}-train" in out.stdout
    assert f"root {shared.pid} 1000 MiB {kind}:{kind}-shared" in out.stdout
    doc = json.loads(gpubot_cli(cfg, "status", "node1", "--json").stdout)
    procs = procs_of(doc)
    assert procs[mine.pid]["workload"] == {
        "kind": kind,
        "id": mine.id,
        "name": f"{kind}-train",
        "owner": alice,
        "detail": {"image": IMAGES[kind], "label.owner": alice, "restart": "always"},
    }
    assert procs[shared.pid]["workload"] == {
        "kind": kind,
        "id": shared.id,
        "name": f"{kind}-shared",
        "owner": "root",
        "detail": {"image": IMAGES[kind], "restart": "no"},
    }
    assert procs[mine.pid]["user"] == alice and procs[mine.pid]["used_memory_mib"] == 3000


async def test_owners_decide_self_service(
    settings: Settings,
    store: Store,
    node: SimNode,
    rt: ContainerEngine,
    sim_users: tuple[str, ...],
) -> None:
    alice, bob = sim_users
    mine = rt.run_gpu(f"{rt.kind}-mine", node, 0, user=alice, labels={"owner": alice})
    other = rt.run_gpu(f"{rt.kind}-other", node, 1, user=alice)  # alice's uid, root's container
    node.adopt(mine.pid, 0, 2000)
    node.adopt(other.pid, 1, 2000)

    async def plans(eng: ResetService) -> list[Any]:
        return [
            (await eng.plan(ResetRequest("node1", who, gpus=(g,), min_uid=1000)))[0]
            for who, g in ((alice, 0), (bob, 0), (alice, 1))
        ]

    p_mine, p_bob, p_other = await with_engine(settings, store, plans)
    assert [(t.pid, t.owner, t.forced) for t in p_mine.targets] == [(mine.pid, alice, False)]
    assert p_mine.targets[0].reasons[0] == (
        f"kills container `{rt.kind}-mine` (image `{IMAGES[rt.kind]}`) of Linux user `{alice}`"
    )
    assert p_bob.forced and p_other.forced  # bob's request, and a container no label gives alice
    assert [t.owner for t in p_other.targets] == ["root"]


def test_a_restarting_container_names_its_stop_command(
    fleet: SimFleet,
    node: SimNode,
    rt: ContainerEngine,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    alice, _ = sim_users
    name = f"{rt.kind}-respawner"
    c = rt.run_gpu(name, node, 2, user=alice, labels={"owner": alice}, restart="always")
    node.adopt(c.pid, 2, 2500)
    cfg = config_with(fleet, tmp_path, owner_label=True)  # stop_workloads is off: advice only
    assert gpubot_cli(cfg, "db", "upgrade").returncode == 0
    out = gpubot_cli(cfg, "reset", "node1", "--gpu", "2", "--yes", "--force", "--json")
    doc = json.loads(out.stdout)
    (g,) = doc["gpus"]
    assert g["outcome"] == "respawned", out.stdout + out.stderr
    assert f"container `{name}`" in g["detail"]
    assert f"stop it with `{rt.kind} stop {name}`" in g["detail"]
    assert not [s for s in doc["steps"] if s["kind"] == "stop_workload"]
    # The runtime's restart policy brought it back: a new process, the container running.
    assert not alive(c.pid)
    _, state = rt.inspect(name)
    assert state["State"]["Running"] is True and state["RestartCount"] >= 1
    text = gpubot_cli(cfg, "reset", "node1", "--gpu", "2", "--yes", "--force")
    assert "GPU 2: respawned" in text.stdout and f"`{rt.kind} stop {name}`" in text.stdout


async def test_stop_workloads_really_stops_the_container(
    settings: Settings,
    store: Store,
    node: SimNode,
    rt: ContainerEngine,
    sim_users: tuple[str, ...],
) -> None:
    alice, _ = sim_users
    name = f"{rt.kind}-stopme"
    c = rt.run_gpu(name, node, 3, user=alice, labels={"owner": alice}, restart="always")
    node.adopt(c.pid, 3, 2500)
    s = dataclasses.replace(
        settings, reset=dataclasses.replace(settings.reset, stop_workloads=True)
    )

    async def reset(eng: ResetService) -> Any:
        plan, before = await eng.plan(ResetRequest("node1", alice, gpus=(3,), min_uid=1000))
        assert not plan.forced  # alice's own container: self-service
        return await eng.execute(plan, Ask.by(alice, "test", "t"), before=before)

    result = await with_engine(s, store, reset)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED], render_reset(result)
    stops = [x.data for x in result.steps if x.kind == "stop_workload"]
    cmd = f"{rt.kind} stop {name}"
    assert [(x["command"], x["result"]) for x in stops] == [(cmd, "running"), (cmd, "done")]
    _, state = rt.inspect(name)  # really stopped, for good: no restart brings it back
    assert state["State"]["Running"] is False and state["State"]["Status"] == "exited"
    assert rt.pid_of(name) == 0
    text, doc = render_reset(result), json.loads(json.dumps(result.to_dict(), default=str))
    assert "GPU 3: freed" in text
    assert [(x["command"], x["result"]) for x in doc["steps"] if x["kind"] == "stop_workload"] == [
        (cmd, "running"),
        (cmd, "done"),
    ]
    assert result.action_id is not None
    detail = await store.action(result.action_id)
    assert detail is not None  # the audit log holds the stop, before and after it ran
    logged = [
        e
        for e in json.loads(json.dumps(detail.as_dict(), default=str))["events"]
        if e.get("kind") == "stop_workload"
    ]
    assert [(e["command"], e["result"]) for e in logged] == [(cmd, "running"), (cmd, "done")]
    wait_until(lambda: node.state()["gpus"][3]["memory_used_mib"] == 0, 10, "GPU 3 freed")
