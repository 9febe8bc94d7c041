"""Stopping a workload is a kill of everything in it (issue 21, hostile case 3).

On the simulated fleet, over SSH, with ``[reset] stop_workloads = true``: user A's respawning GPU
process runs in a service unit (a real cgroup, ``/system.slice/gpusim-N.service`` in the v2 and
v1 ``name=systemd`` hierarchies) that also holds user B's process, which uses no GPU. A's own
reset must not run ``systemctl stop`` (the stand-in kills every process of the unit's cgroup):
B's process lives, the outcome says why, the refusal is audited. The control removes the gate
and B's process dies. A unit of A's processes only is still stopped at once; an approved forced
reset stops the shared unit. Flows run as typed on the console (the chat layer Slack uses).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, build
from gpubot.chat.flows import Flows
from gpubot.cli.console import identity
from gpubot.config import load
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.core.reset.plan import ResetRequest
from gpubot.core.reset.stop_script import Foreign, parse_stop_output, stop_check_argv
from gpubot.core.reset.stopgate import gate_for
from gpubot.services.reset import Ask, ResetService
from gpubot.services.status import StatusService
from gpubot.store import open_store
from gpubot.transport import make_transport
from gpusim.cgroups import find_hierarchies
from gpusim.fleet import SimFleet, SimNode
from gpusim.spawning import Workload
from gpusim.sudoers import readme_sudo_rule
from tests.fixtures.slack import slack_settings_for
from tests.procs import alive, wait_until


@pytest.fixture(scope="module")
def fleet(
    cgroups_ok: None, sim_users: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("stop-shared"), nodes=1, gpus=2, runtimes=True, release_delay_s=0.2
    ) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.clear()  # kills by pid what the test left, removes its cgroups, empties the registry


@pytest.fixture
async def app(fleet: SimFleet, sim_users: tuple[str, ...], tmp_path: Path) -> AsyncIterator[App]:
    """The bot's services over the fleet: U0OWNER is user A, stop_workloads on."""
    alice, _ = sim_users
    s = slack_settings_for(fleet.config_path, alice)
    reset = dataclasses.replace(
        s.reset, grace_s=1.0, verify_timeout_s=8.0, poll_interval_s=0.2, stop_workloads=True
    )
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    s = dataclasses.replace(s, reset=reset, database_url=url)
    built = build(s, {}, need_store=True, front=ConsoleFront())
    yield built
    await built.close()


@pytest.fixture
def flows(app: App) -> Flows:
    return app.flows


@contextlib.contextmanager
def joined(w: Workload, user: str, *, v2: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """Start a process of ``user`` that holds no GPU and move it into ``w``'s unit (v2 and v1
    ``name=systemd``; only v1 with ``v2=False``); end it by pid afterwards."""
    assert w.cgroup_path is not None and w.cgroup_v1_path is not None
    with open("/proc/self/mountinfo", encoding="utf-8") as f, open("/proc/self/cgroup") as g:
        h = find_hierarchies(f.read(), g.read())
    assert not isinstance(h, str), h
    dirs = [h.systemd + w.cgroup_v1_path] if h.systemd is not None else []
    dirs += [h.v2 + w.cgroup_path] if v2 else []
    assert dirs
    proc = subprocess.Popen(["sleep", "300"], user=user, stdin=subprocess.DEVNULL)
    try:
        for d in dirs:
            Path(d, "cgroup.procs").write_text(str(proc.pid))
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def stop_steps(app: App) -> list[dict[str, Any]]:
    """Return the ``stop_workload`` events of the latest action, as the audit log holds them."""
    assert app.store is not None
    latest = (await app.store.actions())[0]
    detail = await app.store.action(latest.id)
    assert detail is not None
    events = json.loads(json.dumps(detail.as_dict(), default=str))["events"]
    return [e for e in events if e.get("kind") == "stop_workload"]


def respawning_service(node: SimNode, user: str) -> Workload:
    w = node.spawn(gpu=0, mib=2000, cgroup="service", behaviour="respawn", user=user)
    assert w.unit is not None and w.unit.endswith(".service")
    return w


async def test_a_shared_unit_is_not_stopped_by_a_self_service_reset(
    app: App, flows: Flows, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    w = respawning_service(node, alice)
    with joined(w, bob) as other:
        text = await answer(flows, "reset node1 gpu 0", identity(flows.svc.policy, "U0OWNER"))
        assert "Approval needed" not in text  # A's own processes: self-service
        assert alive(other.pid)  # B's process was not stopped with the unit
        assert w.alive() and w.current_pid() is not None  # nor was the unit: it respawns
    uid = pwd.getpwnam(bob).pw_uid
    said = f"unit `{w.unit}` also runs processes of uid {uid} ({bob}), pid {other.pid}: stopping"
    assert "respawned" in text and said in text, text
    assert "stopping it needs an on-call approval" in text
    steps = await stop_steps(app)
    cmd = f"systemctl stop {w.unit}"
    assert [(s["command"], s["result"]) for s in steps] == [(cmd, "running"), (cmd, "not-run")]
    assert steps[0]["forced"] is False and steps[0]["requester_uid"] == pwd.getpwnam(alice).pw_uid
    assert said in steps[1]["why"]
    assert {"pid": other.pid, "real_uid": uid, "uid": uid} in steps[1]["foreign"]


async def test_control_without_the_gate_the_stop_kills_the_other_users_process(
    app: App,
    flows: Flows,
    node: SimNode,
    sim_users: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alice, bob = sim_users

    def ungated(*args: Any, **kwargs: Any) -> Any:  # the old rule: GPU processes only
        return dataclasses.replace(gate_for(*args, **kwargs), gate=False, why_not=None)

    monkeypatch.setattr("gpubot.services.workloads.gate_for", ungated)
    w = respawning_service(node, alice)
    with joined(w, bob) as other:
        text = await answer(flows, "reset node1 gpu 0", identity(flows.svc.policy, "U0OWNER"))
        wait_until(lambda: not alive(other.pid), 10.0, "B's process to die with the unit")
    assert "freed" in text and not w.alive()
    assert [s["result"] for s in await stop_steps(app)] == ["running", "done"]


async def test_a_unit_of_the_requesters_own_processes_stops_at_once(
    app: App, flows: Flows, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, _ = sim_users
    w = respawning_service(node, alice)
    with joined(w, alice) as mine:
        text = await answer(flows, "reset node1 gpu 0", identity(flows.svc.policy, "U0OWNER"))
        wait_until(lambda: not alive(mine.pid), 10.0, "A's other process to stop with the unit")
    assert "Reset node1 · GPU 0 · freed" in text, text
    assert not w.alive() and w.current_pid() is None
    steps = await stop_steps(app)
    assert [s["result"] for s in steps] == ["running", "done"]
    assert steps[1]["checked"] >= 3 and steps[1]["foreign"] == []  # supervisor, child, sleep


async def test_a_unit_with_another_users_process_in_v1_only_is_not_stopped(
    app: App, flows: Flows, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    w = respawning_service(node, alice)
    with joined(w, bob, v2=False) as other:  # in the unit's name=systemd cgroup only
        text = await answer(flows, "reset node1 gpu 0", identity(flows.svc.policy, "U0OWNER"))
        assert alive(other.pid) and w.alive()
    assert f"({bob}), pid {other.pid}: stopping it needs an on-call approval" in text


async def test_an_approved_forced_reset_stops_the_shared_unit(
    app: App, flows: Flows, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    w = respawning_service(node, alice)
    policy = flows.svc.policy
    with joined(w, bob) as other:
        asked = await answer(flows, "reset node1 gpu 0", identity(policy, "U0BOB"))
        assert "Approval needed · forced kill on node1" in asked
        assert f"`systemctl stop {w.unit}`: it stops every process of unit `{w.unit}`" in asked
        line = next(x for x in asked.splitlines() if "an approver types: approve" in x)
        approval_id = int(line.split("approve ")[1].split()[0])
        assert alive(other.pid)
        done = await answer(flows, f"approve {approval_id}", identity(policy, "U0CAROL"))
        wait_until(lambda: not alive(other.pid), 10.0, "the approved stop to end the unit")
    assert "freed" in done and not w.alive()
    steps = await stop_steps(app)
    assert [s["result"] for s in steps] == ["running", "done"] and steps[0]["forced"] is True
    uid = pwd.getpwnam(bob).pw_uid
    assert {"pid": other.pid, "real_uid": uid, "uid": uid} in steps[1]["foreign"]  # on record


async def test_a_slurm_job_is_cancelled_self_service_only_when_all_of_it_is_the_users(
    app: App, flows: Flows, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    me = identity(flows.svc.policy, "U0OWNER")
    job = node.spawn(gpu=1, mib=1500, cgroup="slurm", behaviour="respawn", job_user=alice)
    with joined(job, bob) as other:
        text = await answer(flows, "reset node1 gpu 1", me)
        assert alive(other.pid) and job.alive()
    assert f"Slurm job {job.job_id} also runs processes of uid" in text, text
    assert f"`scancel {job.job_id}` ends the job on every node it runs on" in text
    node.clear()
    job = node.spawn(gpu=1, mib=1500, cgroup="slurm", behaviour="respawn", job_user=alice)
    with joined(job, alice) as mine:
        text = await answer(flows, "reset node1 gpu 1", me)
        wait_until(lambda: not alive(mine.pid), 10.0, "the job's other process to end")
    assert "Reset node1 · GPU 1 · freed" in text, text
    steps = await stop_steps(app)
    assert [(s["command"], s["result"]) for s in steps] == [
        (f"scancel {job.job_id}", "running"),
        (f"scancel {job.job_id}", "done"),
    ]
    assert ("", f"/system.slice/slurmstepd.scope/job_{job.job_id}") in [
        tuple(c.split(":", 1)) for c in steps[0]["cgroups"]
    ]


@pytest.fixture(scope="module")
def sudo_fleet(
    cgroups_ok: None, sim_users: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    """A ``sudo = true`` fleet whose sudo allows exactly the README's rule."""
    rule = readme_sudo_rule(Path(__file__).resolve().parents[2] / "README.md")
    with SimFleet(
        tmp_path_factory.mktemp("stop-sudo"),
        nodes=1,
        gpus=1,
        runtimes=True,
        release_delay_s=0.2,
        sudo_rule=rule,
    ) as f:
        yield f


async def test_on_a_sudo_node_the_checked_stop_runs_through_the_rules_sudo(
    sudo_fleet: SimFleet, sim_users: tuple[str, ...], tmp_path: Path
) -> None:
    alice, bob = sim_users
    s = load(sudo_fleet.config_path)
    reset = dataclasses.replace(
        s.reset, grace_s=1.0, verify_timeout_s=8.0, poll_interval_s=0.2, stop_workloads=True
    )
    s = dataclasses.replace(s, reset=reset)
    store = open_store(f"sqlite:///{tmp_path}/audit.db", check_schema=False)
    store.upgrade()
    transport = make_transport(s.ssh)
    node = sudo_fleet.node("node1")
    try:
        engine = ResetService(s, transport, store, StatusService(s, transport, store))
        for other_user, stopped in ((bob, False), (alice, True)):
            w = respawning_service(node, alice)
            with joined(w, other_user) as other:
                plan, before = await engine.plan(
                    ResetRequest("node1", alice, gpus=(0,), min_uid=1000)
                )
                result = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
                if stopped:
                    wait_until(lambda: not alive(other.pid), 10.0, "the unit to stop")
                assert alive(other.pid) is not stopped
            assert [g.outcome == "freed" for g in result.gpus] == [stopped]
            calls = [c["argv"] for c in node.sudo_log() if "systemctl" in c["command"]]
            assert calls == ([["-n", "systemctl", "stop", w.unit]] if stopped else [])
            assert all(c["verdict"] == "run" for c in node.sudo_log())
            node.clear()
    finally:
        await transport.close()
        store.close()


# ---- the script itself, on real cgroups of this machine ------------------------------------


@pytest.fixture
def unit(cgroups_ok: None) -> Iterator[Path]:
    """A fresh cgroup at the root of the v2 hierarchy; removed (leaf first) afterwards."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f, open("/proc/self/cgroup") as g:
        h = find_hierarchies(f.read(), g.read())
    assert not isinstance(h, str), h
    top = Path(h.v2, f"gpubot-stopgate-{os.getpid()}-{secrets.token_hex(4)}")
    top.mkdir()
    try:
        yield top
    finally:
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(str(p))):
            d.rmdir()
        top.rmdir()


@contextlib.contextmanager
def started(argv: list[str], user: str | None, where: Path) -> Iterator[int]:
    """Run ``argv`` (as ``user``) in the cgroup ``where``; kill it by pid afterwards."""
    proc = subprocess.Popen(argv, user=user, stdin=subprocess.DEVNULL)
    try:
        (where / "cgroup.procs").write_text(str(proc.pid))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def check(top: Path, uid: int, kind: str = "service", cwd: Path | None = None) -> Any:
    argv = stop_check_argv(
        ["echo", "STOPPED"], [("", "/" + top.name)], uid=uid, gate=True, sudo=False, kind=kind
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True, cwd=cwd)
    return parse_stop_output(out.stdout)


def test_hostile_child_cgroup_names_run_nothing_and_are_still_read(
    unit: Path, sim_users: tuple[str, ...], tmp_path: Path
) -> None:
    alice, bob = sim_users
    mark = tmp_path / "ran"  # what the name would make, were it run in the script's folder
    child = unit / "a b;$(touch ran);`touch ran`'\"\\"
    child.mkdir()
    uid = pwd.getpwnam(alice).pw_uid
    with started(["sleep", "60"], alice, unit), started(["sleep", "60"], bob, child) as theirs:
        got = check(unit, uid, cwd=tmp_path)
        assert got.refused and [f.pid for f in got.foreign] == [theirs] and got.checked == 2
    with started(["sleep", "60"], alice, unit), started(["sleep", "60"], alice, child):
        got = check(unit, uid, cwd=tmp_path)
        assert got.stopping and got.output == "STOPPED" and got.checked == 2
    assert not mark.exists()


def test_a_slurm_jobs_own_slurmstepd_is_not_another_users_process(
    unit: Path, sim_users: tuple[str, ...]
) -> None:
    alice, bob = sim_users
    folder = Path(tempfile.mkdtemp(prefix="gpubot-stepd-"))  # under /tmp: others may run it
    folder.chmod(0o755)
    stepd = folder / "slurmstepd"  # comm "slurmstepd", as Slurm's own step daemon
    shutil.copy("/bin/sleep", stepd)
    stepd.chmod(0o755)
    try:
        _stepd(unit, stepd, alice, bob)
    finally:
        shutil.rmtree(folder)


def _stepd(unit: Path, stepd: Path, alice: str, bob: str) -> None:
    uid = pwd.getpwnam(alice).pw_uid
    with started(["sleep", "60"], alice, unit), started([str(stepd), "60"], None, unit) as root:
        assert check(unit, uid, kind="slurm").stopping
        got = check(unit, uid, kind="service")  # control: in a unit it is root's process
        assert got.refused and got.foreign == (Foreign(root, 0, 0),)
    with started([str(stepd), "60"], bob, unit) as fake:  # a user's own "slurmstepd"
        got = check(unit, uid, kind="slurm")
        assert got.refused and [f.pid for f in got.foreign] == [fake]


def test_what_the_check_cannot_see_refuses_the_stop(unit: Path) -> None:
    empty = check(unit, 0)
    assert empty.refused and empty.checked == 0  # nothing found: a wrong path, never a stop
    argv = stop_check_argv(
        ["echo", "STOPPED"],
        [("", "/" + unit.name), ("", "/" + unit.name + "-gone")],
        uid=0,
        gate=True,
        sudo=False,
        kind="service",
    )
    with started(["sleep", "60"], None, unit):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        got = parse_stop_output(out.stdout)
        assert got.refused and got.unreadable == (2,) and "STOPPED" not in out.stdout
