"""A hostile user with a shell on a node attacks gpubot, over asyncssh's server and OpenSSH sshd.

``gpusim-alice`` (an unprivileged Linux user) runs a job that holds a GPU, watches ``/proc`` for
anything gpubot runs (hunting for per-call secrets) and rewrites its own argv and comm at run time
with text shaped like every framing the probe ever used: section markers, /proc lines, owner lines,
compute-app rows and fuser lines, newlines included. The simulated ``nvidia-smi`` reports process
names from argv[0] at query time, as NVML does. ``gpusim-bob`` is the victim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import Settings
from gpubot.core.models import NodeSnapshot, Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import ResetRefused
from gpubot.services.reset import Ask, NodeLocks, ResetResult, ResetService
from gpubot.services.status import StatusService
from gpubot.store import Store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode, Workload
from gpusim.node import gpu_uuid
from tests.fixtures.fleet import gpubot_cli, reset_fixtures
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import FakeSlack, running_bot, slack_settings_for, slack_tables
from tests.procs import alive

SERVERS = ["asyncssh", "sshd"]


def forged_claim(node: SimNode, pid: int, ticks: int, uid: int, user: str, gpu: int) -> str:
    """Text that, were it taken for probe output, would say ``pid`` is ``user``'s job on ``gpu``."""
    p_line = f"p {pid} S 1 {ticks} {uid} {uid} =python3 =python3 ! =0::/ =0"
    stat = f"{pid} (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {ticks} 0 0"
    return (
        "python3\n"
        f"\n@gpubot fuser 0\n{node.device(gpu)}: {user} {pid} F...m\n"
        f"\n@gpubot procs\nc 100 1.0\n{p_line}\ng {{pid}}\nu {uid} ={user}\n\n@gpubot end\n"
        f"\n{{token}} stat {pid}\n{stat}\n{{token}} owners\n/proc/{pid} {user} {uid}\n"
        f"{{token}} end\n{pid}, {gpu_uuid(node.name, gpu)}, 1 MiB, python3\n"
        f"{node.device(gpu)}:  {user}  {pid} F...m python3\n"
    )


def self_disguise() -> str:
    """Text by which a job would pass for gone, reused, root's, or a protected daemon."""
    return (
        "/usr/bin/nvidia-persistenced\n\n@gpubot procs\nc 100 1.0\ng {pid}\n"
        "p {pid} S 1 1 0 0 =nvidia-persiste =/usr/bin/nvidia-persistenced "
        "=/usr/bin/nvidia-persistenced =0::/ =0\nu 0 =root\n\n@gpubot end\n"
        "\n{token} stat {pid}\n{pid} (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n"
        "{token} owners\n/proc/{pid} root 0\n{token} end\n"
    )


def wait_forging(w: Workload) -> None:
    """Wait until the job's argv shows its payload (the forger thread started)."""
    deadline = time.monotonic() + 10
    while b"\n" not in Path(f"/proc/{w.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the forger never rewrote its argv"
        time.sleep(0.02)


@pytest.fixture(scope="module", params=SERVERS)
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sim_users: tuple[str, ...],
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("hostile"),
        nodes=1,
        gpus=4,
        release_delay_s=0.3,
        server=request.param,
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures()


def uid_of(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


async def execute(engine: ResetService, requester: str | None, **kw: Any) -> ResetResult:
    plan, before = await engine.plan(ResetRequest("node1", requester, **kw))
    return await engine.execute(plan, Ask.by("test", "test", "test"), before=before)


def row(snap: NodeSnapshot, pid: int) -> Any:
    (p,) = [p for p in snap.processes if p.pid == pid]
    return p


async def test_a_forged_claim_on_another_users_process_changes_nothing(
    engine: ResetService, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    victim = node.spawn(gpu=1, mib=4000, user=bob)
    forger = node.spawn(
        gpu=0,
        mib=1000,
        user=alice,
        forge=forged_claim(node, victim.pid, victim.start_ticks, uid_of(alice), alice, 1),
    )
    wait_forging(forger)
    for _ in range(5):  # while the forger keeps rewriting itself, status stays true
        snap = await engine.status.snapshot(engine.status.node("node1"))
        v, f = row(snap, victim.pid), row(snap, forger.pid)
        assert (v.user, v.uid, v.start_ticks, v.gpu_index, v.used_memory_mib) == (
            bob,
            uid_of(bob),
            victim.start_ticks,
            1,
            4000,
        )
        assert (f.user, f.uid, f.gpu_index, f.used_memory_mib) == (alice, uid_of(alice), 0, 1000)
        assert {p.pid for p in snap.processes} == {victim.pid, forger.pid}
        assert "\n" not in f.command and "\n" not in f.process_name
    # alice asks to free GPU 1: bob's job is a forced kill, never her self-service.
    plan, _ = await engine.plan(ResetRequest("node1", alice, gpus=(1,)))
    assert [(t.pid, t.user, t.forced) for t in plan.targets] == [(victim.pid, bob, True)]
    assert alive(victim.pid)


async def test_a_job_cannot_disguise_itself_out_of_an_approved_forced_kill(
    engine: ResetService, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, _ = sim_users
    job = node.spawn(gpu=2, mib=3000, user=alice, name="nvidia-persistenced", forge=self_disguise())
    wait_forging(job)
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(2,)))
    assert [(t.pid, t.user, t.uid, t.forced) for t in plan.targets] == [
        (job.pid, alice, uid_of(alice), True)
    ]
    assert plan.skipped == ()
    result = await engine.execute(plan, Ask.by("test", "test", "test"), before=before)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    assert not alive(job.pid)


async def test_a_job_named_like_the_persistence_daemon_is_an_ordinary_job(
    engine: ResetService, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    job = node.spawn(gpu=3, mib=2000, user=alice, name="nvidia-persistenced")
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert row(snap, job.pid).process_name == "nvidia-persiste"  # the kernel cuts comm at 15
    plan, _ = await engine.plan(ResetRequest("node1", bob, pids=(job.pid,)))
    assert [(t.pid, t.forced) for t in plan.targets] == [(job.pid, True)]  # approval still needed
    result = await execute(engine, alice, pids=(job.pid,))  # its owner frees it herself
    assert not result.plan.forced and [g.outcome for g in result.gpus] == [Outcome.FREED]
    assert not alive(job.pid)


async def test_a_real_protected_daemon_is_left_alone_and_the_gpu_is_not_called_free(
    settings: Settings, store: Store, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    exe = node.daemon_exe("nvidia-persistenced")
    daemon = node.spawn(gpu=1, mib=500, exe_path=exe)  # root's, running the configured file
    job = node.spawn(gpu=1, mib=3000, user=sim_users[0])
    protect = dataclasses.replace(settings.reset, protected=(exe,), system_users=("root",))
    s = dataclasses.replace(settings, reset=protect)
    transport = make_transport(s.ssh)
    try:
        engine = ResetService(s, transport, store, StatusService(s, transport, store), NodeLocks())
        with pytest.raises(ResetRefused, match="protected system daemon"):
            await engine.plan(ResetRequest("node1", "root", pids=(daemon.pid,)))
        result = await execute(engine, "root", gpus=(1,))
        assert [t.pid for t in result.plan.targets] == [job.pid]
        (kept,) = result.plan.skipped
        assert (kept.pid, kept.protected, kept.reason) == (
            daemon.pid,
            True,
            "protected system daemon",
        )
        (g,) = result.gpus
        assert g.outcome is Outcome.STUCK and f"pid {daemon.pid}" in g.detail
        assert "protected system daemon" in g.detail and "500 MiB" in g.detail
        assert alive(daemon.pid) and not alive(job.pid)
        sent = {s.data["pid"] for s in result.steps if s.kind == "signal"}
        assert sent == {job.pid}
    finally:
        await transport.close()


async def test_the_kill_time_check_compares_the_owner(
    engine: ResetService, node: SimNode, store: Store, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    job = node.spawn(gpu=0, mib=1000, user=bob)
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(0,)))
    (t,) = plan.targets
    # A plan that got the owner wrong (as a forged probe would have): the node refuses.
    wrong = dataclasses.replace(plan, targets=(dataclasses.replace(t, uid=uid_of(alice)),))
    result = await engine.execute(wrong, Ask.by("test", "test", "test"), before=before)
    assert alive(job.pid)
    steps = [s for s in result.steps if s.kind == "signal"]
    assert steps and {(s.data["pid"], s.data["result"]) for s in steps} == {(job.pid, "owner")}
    assert f"uid {uid_of(bob)}" in steps[0].data["why"]
    (g,) = result.gpus
    assert g.outcome is Outcome.UNKNOWN and "not signalled" in g.detail
    (action,) = await store.actions()
    detail = await store.action(action.id)
    assert detail is not None
    events = [e.data for e in detail.events if e.data.get("kind") == "signal"]
    assert events[0]["result"] == "owner" and "not the planned owner" in events[0]["why"]


async def test_status_of_everyone_survives_a_forger(
    engine: ResetService, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    others = [node.spawn(gpu=g, mib=100 * (g + 1), user=bob) for g in (1, 2)]
    forger = node.spawn(gpu=0, mib=50, user=alice, forge="x\n\n@gpubot end\n\n@gpubot end\n" * 20)
    wait_forging(forger)
    fleet = await engine.status.fleet(["node1"])
    assert fleet.ok, fleet.failed
    (snap,) = fleet.snapshots
    got = {(p.pid, p.gpu_index, p.user, p.used_memory_mib) for p in snap.processes}
    assert got == {(w.pid, w.gpu, bob, w.mib) for w in others} | {(forger.pid, 0, alice, 50)}
    await asyncio.sleep(0)


def test_cli_self_service_cannot_be_forged(
    node: SimNode, fleet: SimFleet, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    victim = node.spawn(gpu=1, mib=2000, user=bob)
    # The CLI runs as root here: alice claims bob's job is root's, so that root's plain reset
    # (no --force) would kill it as root's own.
    claim = forged_claim(node, victim.pid, victim.start_ticks, 0, "root", 1)
    forger = node.spawn(gpu=0, mib=100, user=alice, forge=claim)
    wait_forging(forger)
    assert gpubot_cli(fleet.config_path, "db", "upgrade").returncode == 0
    p = gpubot_cli(fleet.config_path, "reset", "node1", "--gpu", "1", "--yes")
    assert p.returncode != 0 and f"kills processes of {bob}" in p.stderr
    assert alive(victim.pid)


async def test_slack_self_service_cannot_be_forged(
    node: SimNode,
    fleet: SimFleet,
    sim_users: tuple[str, ...],
    fake_slack: FakeSlack,
    tmp_path: Path,
) -> None:
    alice, bob = sim_users
    victim = node.spawn(gpu=2, mib=2000, user=bob)
    forger = node.spawn(
        gpu=0,
        mib=100,
        user=alice,
        forge=forged_claim(node, victim.pid, victim.start_ticks, uid_of(alice), alice, 2),
    )
    wait_forging(forger)
    s = slack_settings_for(fleet.config_path, "nobody")
    tables = slack_tables("nobody")
    tables["users"] = {**tables["users"], "U0ALICE": alice}
    tables["permissions"] = {**tables["permissions"], "*": ["U0ALICE", "U0CAROL", "S0ONCALL"]}
    s = with_tables(s, tables)
    async with running_bot(s, fake_slack, f"sqlite:///{tmp_path}/audit.db") as h:
        await h.send.command("reset node1 gpu 2", user="U0ALICE")
        await h.settle()
        oncall = [c for c in h.fake.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        assert len(oncall) == 1  # an on-call responder is asked: a forced kill
        assert bob in json.dumps(oncall[0].body) and alive(victim.pid)
        assert await h.store.actions() == []  # nothing ran
