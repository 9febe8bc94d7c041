"""Slurm as a source (issue 36), against the real one-node Slurm 22.05 with four GPU GRES.

The simulated node's sessions run the real ``sinfo``, ``squeue`` and ``scontrol`` (wrappers on
PATH carry ``SLURM_CONF``); its GPUs' device minors are gres.conf's ``File=`` digits, so the map
from Slurm's GRES index to a GPU is proven. alice's job is allocated two GPUs and holds the
first; bob runs a process on a third GPU outside Slurm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fake_slack import FakeSlack
from gpubot.app import build
from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_RESET_GPU
from gpubot.config import Settings, load
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import Granted
from gpubot.core.findings import Finding
from gpubot.core.policy import Person
from gpubot.core.slurm import SlurmSettings
from gpubot.errors import UsageError
from gpubot.services.claims import ClaimService
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.real_runs import real_fleet
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import (
    QUICK_TIMEOUT_S,
    running_bot,
    slack_front,
    slack_tables,
    workload_owner,
)
from tests.fixtures.slack_flows import blocks_of, request_in_oncall
from tests.fixtures.slurm import SlurmCluster
from tests.procs import alive, wait_until

WINDOW_S = 3.0
ALERTS = {"alerts": {"channel": "C0ALERTS"}}


@pytest.fixture(scope="module")
def fleet(
    sim_users: tuple[str, ...],
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimFleet]:
    with real_fleet(
        tmp_path_factory.mktemp("slurm-aware"), ["slurm"], [slurm_cluster.bin_dir]
    ) as f:
        yield f


@pytest.fixture(scope="module")
def config(
    fleet: SimFleet, slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The fleet's settings: node1 is Slurm's (its NodeName the cluster's), a short window,
    claims on beside Slurm (so that a claim of an allocated GPU meets the job), a database."""
    text = fleet.config_path.read_text()
    text, n = re.subn(
        r'(?m)^name = "node1"$',
        f'name = "node1"\nscheduler = "slurm"\nslurm_node = "{slurm_cluster.node_name}"',
        text,
    )
    assert n == 1
    db = tmp_path_factory.mktemp("slurm-aware-db") / "gpubot.db"
    text = re.sub(r'(?m)^url = "sqlite:///.*"$', f'url = "sqlite:///{db}"', text, count=1)
    text += f'\n[slurm]\nunused_after = "{WINDOW_S:g}s"\nclaims = true\n'
    text += "\n[claims]\nenabled = true\n"
    path = tmp_path_factory.mktemp("slurm-aware-conf") / "gpubot.toml"
    path.write_text(text)
    assert gpubot_cli(path, "db", "upgrade").returncode == 0
    return path


@pytest.fixture
def node(fleet: SimFleet, slurm_cluster: SlurmCluster) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    slurm_cluster.cancel_all()
    n.clear()


def allocated(cluster: SlurmCluster, job: str) -> list[int]:
    """Return the GRES indices Slurm gave ``job`` once it runs (its ``gres_detail``)."""
    wait_until(lambda: bool(cluster.job_json(job)["gres_detail"]), 30, f"job {job} running")
    (detail,) = cluster.job_json(job)["gres_detail"]
    m = re.fullmatch(r"gpu(?::\d+)?\(IDX:(\d+)(?:-(\d+))?\)", detail)
    assert m is not None, detail
    return list(range(int(m[1]), int(m[2] or m[1]) + 1))


def test_allocation_beside_use_a_finding_once_and_a_claim_refused(
    config: Path,
    fleet: SimFleet,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
) -> None:
    alice, bob = sim_users
    script = f'g=${{SLURM_JOB_GPUS%%,*}}; exec 3<>{node.dev_prefix}"$g"; exec sleep 1000000'
    job = slurm_cluster.sbatch(alice, script, "train", gres="gpu:2", time_limit="30")
    idx = allocated(slurm_cluster, job)
    assert len(idx) == 2
    used, unused = idx  # the sim's GPU i has device minor i; gres.conf's File= i is minor i
    pid = slurm_cluster.holder(job, node.device(used))
    node.adopt(pid, used, 3000)
    outside = next(g for g in range(4) if g not in idx)
    node.spawn(gpu=outside, mib=1000, user=bob)

    out = gpubot_cli(config, "status", "node1", "--json")
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)["nodes"]
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert gpus[used]["slurm"]["job"] == job and gpus[used]["slurm"]["used"] is True
    assert gpus[unused]["slurm"]["job"] == job and gpus[unused]["slurm"]["used"] is False
    assert gpus[used]["slurm"]["user"] == alice and gpus[used]["slurm"]["map_proven"] is True
    assert gpus[outside]["slurm"]["job"] is None and "outside-slurm" in gpus[outside]["flags"]
    assert "allocated-unused" in gpus[unused]["flags"] and gpus[used]["flags"] == []
    assert not [n for n in doc["notes"] if "name no scheduler" in n]  # it is named here
    text = gpubot_cli(config, "status", "node1").stdout
    assert f"Slurm job {job} ({alice}, train): GPU {used}, {unused}" in text
    time_left_shown(slurm_cluster, job, [gpus[used], gpus[unused]], text)
    no_scheduler_no_slurm(fleet.config_path, job)

    fake = FakeSlack()
    found = asyncio.run(sweeps(with_tables(load(config), ALERTS), fake, 4))
    first, second, third, fourth = ([(f.kind.value, f.gpu, f.owner) for f in r] for r in found)
    assert ("slurm-outside", outside, bob) in first
    assert not any(k == "slurm-allocated-unused" for k, _, _ in first)  # not for the window yet
    for later in (second, third, fourth):
        assert [x for x in later if x[0] == "slurm-allocated-unused"] == [
            ("slurm-allocated-unused", unused, alice)
        ]
    # Seen twice, then alerted once: the later sweeps see it again and post nothing new.
    calls = fake.of("chat.postMessage")
    about = [c.body for c in calls if "GPU allocated by Slurm, unused" in json.dumps(c.body)]
    assert len(about) == 1, [c.body for c in calls]
    assert f"Slurm job {job} (train) of {alice} was allocated GPU {unused}" in json.dumps(about[0])
    assert about[0]["channel"] == ALERTS["alerts"]["channel"]  # on-call's list: the alerts

    msg = asyncio.run(claim_of(load(config), bob, unused))
    assert f"node1 GPU {unused} is allocated by Slurm to job {job} ({alice}, " in msg
    free = next(g for g in range(4) if g not in (*idx, outside))  # no job's, no process
    assert asyncio.run(claim_granted(load(config), bob, free)) == [("node1", free, bob)]


def time_left_shown(
    cluster: SlurmCluster, job: str, entries: list[dict[str, Any]], text: str
) -> None:
    """The job's 30-minute limit: ``--json``'s ``end`` is its start + 1800 s (Slurm's own
    ``end_time``), and the text says the minutes left."""
    start = cluster.job_json(job)["start_time"]
    for e in entries:
        end = e["slurm"]["end"]
        assert end is not None and abs(end - (start + 1800)) <= 60, (e, start)
    m = re.search(rf"Slurm job {job} \(.*, (\d+) min left$", text, re.M)
    assert m is not None and 20 <= int(m[1]) <= 30, text


def no_scheduler_no_slurm(plain: Path, job: str) -> None:
    """The control: the same node and job, its settings naming no scheduler: ``"slurm": null``
    on every GPU, and a note that Slurm's jobs run there (detected, never assumed)."""
    out = gpubot_cli(plain, "status", "node1", "--json")
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)["nodes"]
    assert [g["slurm"] for g in doc["gpus"]] == [None] * 4
    (note,) = [n for n in doc["notes"] if "name no scheduler" in n]
    assert f"processes here run in Slurm jobs ({job})" in note and 'scheduler = "slurm"' in note
    text = gpubot_cli(plain, "status", "node1").stdout
    assert "but the settings name no scheduler for node1" in text


async def sweeps(settings: Settings, fake: FakeSlack, n: int) -> list[list[Finding]]:
    """Run ``n`` alerting sweeps of the app on Slack (``fake``), the first two ``WINDOW_S``
    apart; return each one's findings."""
    await fake.start()
    app = build(settings, {}, need_store=True, front=slack_front(fake, timeout=QUICK_TIMEOUT_S))
    out = []
    try:
        for i in range(n):
            if i == 1:
                await asyncio.sleep(WINDOW_S + 0.5)
            out.append(list((await app.sweep.run(alerting=True)).findings))
    finally:
        await app.close()
        await fake.stop()
    return out


async def claim_of(settings: Settings, user: str, gpu: int) -> str:
    app = build(settings, {}, need_store=True)
    try:
        assert app.store is not None
        svc = ClaimService(settings, app.store.claims, app.status)
        with pytest.raises(UsageError) as err:
            await svc.claim(
                Person("U0BOB", user, user), cc.ClaimGpus("node1", (gpu,), 0, 3600.0), "cli"
            )
        return str(err.value)
    finally:
        await app.close()


async def claim_granted(settings: Settings, user: str, gpu: int) -> list[tuple[str, int, str]]:
    """Claim ``gpu`` of node1 as ``user``; return what was granted, released again."""
    app = build(settings, {}, need_store=True)
    try:
        assert app.store is not None
        svc = ClaimService(settings, app.store.claims, app.status)
        who = Person("U0BOB", user, user)
        got = await svc.claim(who, cc.ClaimGpus("node1", (gpu,), 0, 3600.0), "cli")
        assert isinstance(got, Granted), got
        await svc.release(who, cc.Release("node1", (gpu,)), "cli")
        return [(c.node, c.gpu, c.user) for c in got.claims]
    finally:
        await app.close()


def test_control_claims_off_beside_slurm_answer_with_how_to_ask_slurm(
    config: Path, node: SimNode, slurm_cluster: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    s = load(config)
    off = dataclasses.replace(s, slurm=SlurmSettings(unused_after_s=WINDOW_S, claims=False))
    msg = asyncio.run(claim_of(off, sim_users[1], 3))
    assert msg.startswith("node1 is scheduled by Slurm: ask it for GPUs instead")
    assert f"salloc -w {slurm_cluster.node_name} --gres=gpu:1" in msg


def test_a_report_without_slurm_accounting_says_so_in_one_note(config: Path) -> None:
    """This cluster keeps no accounting: sacct fails, the report says so once and goes on."""
    out = gpubot_cli(config, "report", "--by", "user", "--since", "1h", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (note,) = doc["slurm"]["notes"]
    assert doc["slurm"]["allocation"] is False
    assert note.startswith("no allocated h (Slurm's accounting not read): sacct on node1 exited")
    assert "accounting storage is disabled" in note, note
    assert all("allocated_ms" not in r for r in doc["rows"])
    text = gpubot_cli(config, "report", "--by", "user", "--since", "1h")
    assert text.returncode == 0 and note in text.stdout.splitlines()
    header = text.stdout.splitlines()[1]
    assert header.startswith("user ") and "allocated" not in header


def buttons_by_finding(fake: FakeSlack) -> dict[str, list[tuple[str, str]]]:
    """Return the buttons of each finding in the alerts posted, by the finding's first line."""
    out: dict[str, list[tuple[str, str]]] = {}
    for post in fake.ok("chat.postMessage"):
        about = ""
        for block in blocks_of(post):
            if block["type"] == "section":
                about = block["text"]["text"].splitlines()[0]
            elif block["type"] == "actions":
                out[about] = [(e["action_id"], e.get("value", "")) for e in block["elements"]]
    return out


async def test_the_outside_process_gets_the_usual_forced_kill(
    config: Path,
    fleet: SimFleet,
    node: SimNode,
    slurm_cluster: SlurmCluster,
    sim_users: tuple[str, ...],
    fake_slack: FakeSlack,
    tmp_path: Path,
) -> None:
    """The "used outside Slurm" alert offers *Reset GPU* for bob's process; U0DAVE (no
    approver) presses it, U0CAROL approves: bob's process is stopped, alice's job runs on."""
    alice, bob = sim_users
    script = f'exec 3<>{node.dev_prefix}"$SLURM_JOB_GPUS"; exec sleep 1000000'
    job = slurm_cluster.sbatch(alice, script, "train", gres="gpu:1")
    (used,) = allocated(slurm_cluster, job)
    held = slurm_cluster.holder(job, node.device(used))
    node.adopt(held, used, 3000)
    outside = next(g for g in range(4) if g != used)
    w = node.spawn(gpu=outside, mib=1000, user=bob)
    s = with_tables(load(config), {**slack_tables(workload_owner(fleet)), **ALERTS})
    settings = dataclasses.replace(s, reset=dataclasses.replace(s.reset, grace_s=1.0))
    async with running_bot(settings, fake_slack, f"sqlite:///{tmp_path}/audit.db") as h:
        for _ in range(2):  # seen twice, then alerted
            found = (await h.app.sweep.run(alerting=True)).findings
        assert [(f.gpu, f.owner) for f in found if f.kind == "slurm-outside"] == [(outside, bob)]
        offered = buttons_by_finding(fake_slack)[f"⚠ *GPU {outside}: GPU used outside Slurm*"]
        assert (ACTION_RESET_GPU, f"node1:{outside}") in offered, offered
        await h.send.click(ACTION_RESET_GPU, f"node1:{outside}", user="U0DAVE", channel="C0ALERTS")
        await h.settle()
        approval_id, ts = request_in_oncall(fake_slack)
        assert alive(w.pid)  # a request: nothing is stopped before on-call decides
        await h.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await h.settle()
        wait_until(lambda: not alive(w.pid), 30, "bob's process stopped")
        assert h.store is not None
        (action,) = await h.store.actions()
        assert (action.kind, action.node, action.gpus, action.status) == (
            "reset",
            "node1",
            (outside,),
            "freed",
        )
    assert alive(held) and slurm_cluster.state(job) == "RUNNING"


MINORS = [3, 1, 0, 2]  # GPU index i opens nvidia{MINORS[i]}: not the order of the indices


@pytest.fixture(scope="module")
def permuted(
    sim_users: tuple[str, ...],
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SimFleet, Path]]:
    """A node whose device minors are not its GPU indices (real boxes number them apart), on
    the same Slurm, and its settings."""
    with SimFleet(
        tmp_path_factory.mktemp("slurm-minors"),
        nodes=1,
        gpus=4,
        runtimes=["slurm"],
        session_path=[str(slurm_cluster.bin_dir)],
        release_delay_s=0.2,
        minors=MINORS,
    ) as f:
        text = f.config_path.read_text()
        slurm = f'name = "node1"\nscheduler = "slurm"\nslurm_node = "{slurm_cluster.node_name}"'
        text, n = re.subn(r'(?m)^name = "node1"$', slurm, text)
        assert n == 1
        path = tmp_path_factory.mktemp("slurm-minors-conf") / "gpubot.toml"
        path.write_text(text)
        yield f, path
        slurm_cluster.cancel_all()


def test_a_jobs_gres_index_is_its_gpu_by_device_minor_not_by_index(
    permuted: tuple[SimFleet, Path], slurm_cluster: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    """Slurm's ``IDX:k`` is gres.conf's k-th ``File=``, the device of minor k; on this node
    that is GPU ``MINORS.index(k)``: status shows the job there, on no other GPU."""
    fleet, config = permuted
    node = fleet.node("node1")
    alice = sim_users[0]
    script = f'g=${{SLURM_JOB_GPUS%%,*}}; exec 3<>{node.dev_prefix}"$g"; exec sleep 1000000'
    job = slurm_cluster.sbatch(alice, script, "minors", gres="gpu:1", time_limit="30")
    (k,) = allocated(slurm_cluster, job)
    gpu = MINORS.index(k)  # the GPU whose device file is gres.conf's k-th
    pid = slurm_cluster.holder(job, node.device(gpu))
    node.adopt(pid, gpu, 2000)
    try:
        out = gpubot_cli(config, "status", "node1", "--json")
        assert out.returncode == 0, out.stderr
        (doc,) = json.loads(out.stdout)["nodes"]
        jobs = {g["index"]: (g["slurm"] or {}).get("job") for g in doc["gpus"]}
        assert jobs == {i: job if i == gpu else None for i in range(4)}, (k, jobs)
        mine = next(g for g in doc["gpus"] if g["index"] == gpu)
        assert mine["slurm"]["used"] is True and mine["slurm"]["map_proven"] is True
        if k != gpu:  # the control: by index, the job would be shown on GPU k
            assert jobs[k] is None
    finally:
        slurm_cluster.cancel_all()
        node.clear()
