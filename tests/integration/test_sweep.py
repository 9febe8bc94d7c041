"""Sweeps against the simulated fleet and real PostgreSQL: every finding kind from its behaviour,
the budget, alerts once (after two sweeps), dedupe, reminder, resolution, snooze, restart, CLI.

Slack is the loopback fake of the Web API; time for reminders and snoozes is a clock the test
moves (the store records what it is given), everything else is real: SSH, processes, signals.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.findings import FindingKey
from gpubot.core.ports import Clock
from gpubot.services.alert_keeper import AlertKeeper
from gpubot.services.sweep import SweepService
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpubot.store.query_records import nodes_digest
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.settings import ManualClock, sweep_ports, with_tables
from tests.fixtures.slack import BOT_TOKEN, FakeSlack, assert_within_limits
from tests.procs import remote_probes, start_ticks, wait_dead, wait_zombie

CHANNEL = "C0ALERTS"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    # These boxes run no nvidia-persistenced. The reset readiness asks `ps -C nvidia-persistenced`,
    # which on this host also sees other test files' simulated daemons (and jobs named so), so the
    # nodes' sessions get a ps that answers that one question as a box without the daemon does.
    tmp = tmp_path_factory.mktemp("sweep")
    shim = tmp / "ps-shim"
    shim.mkdir()
    (shim / "ps").write_text(
        '#!/bin/sh\n[ "$1 $2" = "-C nvidia-persistenced" ] && exit 1\nexec /bin/ps "$@"\n'
    )
    (shim / "ps").chmod(0o755)
    with SimFleet(
        tmp / "fleet", nodes=4, gpus=4, release_delay_s=0.3, session_path=[str(shim)]
    ) as f:
        yield f


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        n.clear()
        n.release_delay_s = 0.3
    for n in fleet.nodes:
        n.start_server()
    # A probe cut short by the budget still runs on its node: let it end before the next test
    # (and before the fleet stops: its SSH server cannot close a session whose command runs).
    deadline = time.monotonic() + 15
    while remote_probes(fleet) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("postgresql", tmp_path) as url:
        yield url


def settings_for(
    fleet: SimFleet, db_url: str, *, command_timeout_s: float = 10.0, **sweep: Any
) -> Settings:
    # Generous timeouts: the box is shared with other test runs; tests of timeouts set their own.
    s = load(fleet.config_path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=command_timeout_s, connect_timeout_s=5.0)
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh)
    return with_tables(s, {"sweep": {"interval_s": 60, **sweep}, "alerts": {"channel": CHANNEL}})


@asynccontextmanager
async def sweeper(
    settings: Settings, *, fake: FakeSlack | None = None, clock: Clock = SYSTEM_CLOCK
) -> AsyncIterator[SweepService]:
    """The real composition (``gpubot.app.build``) with a sweep service over it."""
    app = build(settings, {}, need_store=True)
    notifier = None
    if fake is not None:
        notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake.base_url)), CHANNEL)
    ports = sweep_ports(settings, app.store, notifier=notifier, clock=clock)
    svc = SweepService(settings, app.status, app.transport, ports, clock=clock, replica="test")
    try:
        yield svc
    finally:
        await app.close()


def keeper(svc: SweepService) -> AlertKeeper:
    """Return the sweep's alert keeper (there is one: the sweep has a store)."""
    assert svc.keeper is not None
    return svc.keeper


def kill_and_wait(pid: int) -> None:
    """SIGKILL ``pid`` (a workload this test started) and wait until it is dead."""
    os.kill(pid, 9)
    wait_dead(pid)


def keys(result: Any) -> set[tuple[str, int | None, str, str]]:
    return {tuple(f.key) for f in result.findings}


def posts(fake: FakeSlack) -> list[dict[str, Any]]:
    return [c.body for c in fake.ok("chat.postMessage")]


def blocks_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    b = body.get("blocks") or []
    return json.loads(b) if isinstance(b, str) else list(b)


def all_text(body: dict[str, Any]) -> str:
    return json.dumps(blocks_of(body), ensure_ascii=False) + str(body.get("text", ""))


# --- findings ----------------------------------------------------------------------------------


async def test_each_kind_comes_from_its_behaviour(fleet: SimFleet, pg_url: str) -> None:
    n1, n2, n3, n4 = (fleet.node(f"node{i}") for i in range(1, 5))
    orphan = n1.spawn(gpu=0, mib=6144, behaviour="orphan")
    kill_and_wait(orphan.pid)
    hidden = n1.spawn(gpu=1, mib=2048, behaviour="hidden")
    n1.spawn(gpu=2, mib=4096)  # healthy: busy and listed
    n1.spawn(gpu=None, behaviour="ctl-only")  # holds nvidiactl only: nothing to say
    # The sim has no zombie behaviour: its nvidia-smi is told to list a real zombie's pid (a
    # child of this test that exited unreaped) for the memory a live workload holds.
    carrier = n2.spawn(gpu=0, mib=3072)
    zombie = subprocess.Popen(["true"])
    wait_zombie(zombie.pid)
    zombie_ticks = start_ticks(zombie.pid)
    n2.override("apps", "pid", str(zombie.pid))
    # ... and on node3 the pid of a process that is gone from /proc altogether.
    carrier3 = n3.spawn(gpu=1, mib=1536)
    gone = subprocess.Popen(["true"])
    gone.wait()
    n3.override("apps", "pid", str(gone.pid))
    # 0 % in one sweep is no idle holder: that takes hours of samples (test_sweep_idle.py)
    n4.spawn(gpu=3, mib=8192, util_pct=0)
    settings = settings_for(fleet, pg_url)
    try:
        async with sweeper(settings) as svc:
            result = await svc.run(alerting=False, source="test")
    finally:
        zombie.wait()
    assert result.failed == {}
    assert keys(result) == {
        ("node1", 0, "orphaned-vram", ""),
        ("node1", 1, "hidden-holder", f"{hidden.pid}:{hidden.start_ticks}"),
        ("node2", 0, "zombie-process", f"{zombie.pid}:{zombie_ticks}"),
        ("node2", 0, "hidden-holder", f"{carrier.pid}:{carrier.start_ticks}"),
        ("node3", 1, "zombie-process", f"{gone.pid}:gone"),
        ("node3", 1, "hidden-holder", f"{carrier3.pid}:{carrier3.start_ticks}"),
    }
    by_kind = {(f.node, f.kind.value): f for f in result.findings}
    assert "6144 MiB in use" in by_kind[("node1", "orphaned-vram")].summary
    assert "zombie (state Z)" in by_kind[("node2", "zombie-process")].summary
    assert "gone from /proc" in by_kind[("node3", "zombie-process")].summary
    assert by_kind[("node1", "hidden-holder")].user == fleet.user
    # the reset readiness of the orphaned GPU, honest about what the sim cannot say
    ready = result.readiness[("node1", 0)]
    assert ready.lines() == [
        "processes on GPU 0: none",
        "persistence daemon: not running",
        "NVLink peers: unknown (nvidia-smi topo -m is not available here)",
        "MIG mode: unknown",
    ]
    assert not result.ok


async def test_healthy_fleet_has_no_findings(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node2").spawn(gpu=1, mib=20000, util_pct=0)  # at 0 %, but not for hours yet
    async with sweeper(settings_for(fleet, pg_url)) as svc:
        result = await svc.run(alerting=False)
    assert result.ok and result.findings == () and len(result.snapshots) == 4


async def test_failing_nodes_are_findings_and_hold_up_nobody(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node2").set_fault("driver-error")
    fleet.node("node3").stop_server()
    fleet.node("node4").set_fault("hang")
    async with sweeper(settings_for(fleet, pg_url, command_timeout_s=5.0)) as svc:
        result = await svc.run(alerting=False)
    assert [s.node for s in result.snapshots] == ["node1"]
    assert {n: f.kind.value for n, f in result.failed.items()} == {
        "node2": "smi-failed",
        "node3": "node-unreachable",
        "node4": "smi-failed",
    }
    assert "couldn't communicate with the NVIDIA driver" in result.failed["node2"].reason
    assert "hung" in result.failed["node4"].reason
    assert keys(result) == {
        ("node2", None, "smi-failed", ""),
        ("node3", None, "node-unreachable", ""),
        ("node4", None, "smi-failed", ""),
    }
    assert result.seconds < 5.0  # the hung node took its 3 s; nobody waited for anybody


async def test_the_first_sweep_names_the_nodes_then_only_what_changed(
    fleet: SimFleet, pg_url: str
) -> None:
    fleet.node("node3").stop_server()
    async with sweeper(settings_for(fleet, pg_url, command_timeout_s=5.0)) as svc:
        await svc.run(alerting=False)
        fleet.node("node3").start_server()
        await svc.run(alerting=False)
        await svc.run(alerting=False)
        assert svc.audit is not None
        first, second, third = [r.data for r in reversed(await svc.audit.queries())]
    names = [n.name for n in fleet.nodes]
    assert first["nodes"] == names and list(first["failed"]) == ["node3"]
    assert second == {
        "query": "sweep",
        "node_count": len(names),
        "nodes_digest": nodes_digest(names),
        "failed": {},
        "seconds": second["seconds"],
        "recovered": ["node3"],
    }
    assert "recovered" not in third and third["nodes_digest"] == second["nodes_digest"]


async def test_the_budget_cuts_a_slow_node_short(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node2").set_fault("slow", delay_s=6.0)
    settings = settings_for(fleet, pg_url, command_timeout_s=10.0, interval_s=10, budget_s=5)
    async with sweeper(settings) as svc:
        started = time.monotonic()
        result = await svc.run(alerting=False)
        took = time.monotonic() - started
    assert took < 5.0, took
    assert [s.node for s in result.snapshots] == ["node1", "node3", "node4"]
    assert result.timed_out == ("node2",)
    assert result.failed["node2"].reason == "no answer within the sweep budget (4 s)"
    assert result.failed["node2"].kind.value == "node-slow"  # issue 25: slow, not unreachable


async def test_a_slow_node_is_alerted_as_slow_and_a_stopped_one_as_unreachable(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    fleet.node("node2").set_fault("slow", delay_s=6.0)
    fleet.node("node3").stop_server()  # the control: this one is down
    settings = settings_for(fleet, pg_url, command_timeout_s=10.0, interval_s=10, budget_s=5)
    clock = ManualClock()
    async with sweeper(settings, fake=fake_slack, clock=clock) as svc:
        first = await svc.run()
        clock.advance(300)
        second = await svc.run()
    kinds = {n: f.kind.value for n, f in first.failed.items()}
    assert kinds == {"node2": "node-slow", "node3": "node-unreachable"}
    assert {n: f.kind.value for n, f in second.failed.items()} == kinds
    by_node = {p["text"].split(":", 1)[0].split()[-1]: all_text(p) for p in posts(fake_slack)}
    assert set(by_node) == {"node2", "node3"}, by_node
    assert "node: node too slow to answer" in by_node["node2"]
    assert "unreachable" not in by_node["node2"]
    assert "node: node unreachable" in by_node["node3"]


# --- alerts --------------------------------------------------------------------------------------


async def test_alert_once_then_remind_then_resolve(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    w = n1.spawn(gpu=2, mib=6144, behaviour="orphan")
    kill_and_wait(w.pid)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, pg_url), fake=fake_slack, clock=clock) as svc:
        first = await svc.run()
        assert ("node1", 2, "orphaned-vram", "") in keys(first)
        assert first.alerted == () and posts(fake_slack) == []  # seen once: could be releasing
        clock.advance(300)
        second = await svc.run()
        assert [tuple(k) for k in second.alerted] == [("node1", 2, "orphaned-vram", "")]
        (alert,) = posts(fake_slack)
        assert alert["channel"] == CHANNEL
        text = all_text(alert)
        assert "node1" in text and "GPU 2: orphaned GPU memory" in text
        assert "6144 MiB in use and no process holds the GPU" in text
        assert "NVLink peers: unknown" in text and "MIG mode: unknown" in text
        actions = [e for b in blocks_of(alert) if b["type"] == "actions" for e in b["elements"]]
        assert [(e["action_id"], e["value"]) for e in actions] == [
            ("gpubot_reset_gpu", "node1:2"),
            ("gpubot_snooze_1h", second.alerted[0].text()),
            ("gpubot_snooze_1d", second.alerted[0].text()),
        ]
        assert any(b["type"] == "table" for b in blocks_of(alert))  # the per-GPU table
        ts = fake_slack.ok("chat.postMessage")[0].answer["ts"]

        for _ in range(3):  # it persists: no repeat
            clock.advance(300)
            again = await svc.run()
            assert again.alerted == () and again.reminded == ()
        assert len(posts(fake_slack)) == 1 and fake_slack.of("chat.update") == []

        clock.advance(6 * 3600)  # the reminder, in the alert's thread
        reminded = await svc.run()
        assert [tuple(k) for k in reminded.reminded] == [("node1", 2, "orphaned-vram", "")]
        reminder = posts(fake_slack)[1]
        assert reminder["thread_ts"] == ts and reminder["reply_broadcast"] in (True, "true", "1")
        assert "Still open on node1" in all_text(reminder)
        clock.advance(300)
        assert (await svc.run()).reminded == ()

        # someone resets the GPU: the alert message becomes "resolved" with how long it lasted
        out = subprocess.run([n1.nvidia_smi, "--gpu-reset", "-i", "2"], capture_output=True)
        assert out.returncode == 0, out.stdout
        clock.advance(300)
        assert (await svc.run()).resolved == ()  # cleared for one sweep: held (hysteresis)
        assert fake_slack.of("chat.update") == []
        clock.advance(300)
        cleared = await svc.run()
        assert [tuple(k) for k in cleared.resolved] == [("node1", 2, "orphaned-vram", "")]
        (update,) = [c.body for c in fake_slack.ok("chat.update")]
        assert (update["channel"], update["ts"]) == (CHANNEL, ts)
        assert "node1: resolved" in all_text(update) and "*resolved* after 6 h 35 min" in all_text(
            update
        )
        assert not any(b["type"] == "actions" for b in blocks_of(update))
        assert len(posts(fake_slack)) == 2

        records = [r.data for r in await svc.audit.records() if r.kind == "alert"]  # type: ignore[union-attr]
        assert [r["alert"] for r in records] == ["alerted", "reminded", "resolved"]
    assert_within_limits(fake_slack)


async def test_memory_still_being_released_never_alerts(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    n1.release_delay_s = 2.0
    w = n1.spawn(gpu=3, mib=4096)
    kill_and_wait(w.pid)
    clock = ManualClock()
    async with sweeper(settings_for(fleet, pg_url), fake=fake_slack, clock=clock) as svc:
        first = await svc.run()
        assert ("node1", 3, "orphaned-vram", "") in keys(first)  # looks orphaned for now
        deadline = time.monotonic() + 10
        while any(not a["released"] for a in n1.state()["allocations"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        clock.advance(300)
        second = await svc.run()
    assert second.findings == () and [tuple(k) for k in second.resolved] == [
        ("node1", 3, "orphaned-vram", "")
    ]
    assert fake_slack.calls == []  # never a word in Slack


async def test_one_message_per_node_with_its_findings(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    for g in (0, 1):
        w = fleet.node("node3").spawn(gpu=g, mib=2048 + g, behaviour="orphan")
        kill_and_wait(w.pid)
    fleet.node("node4").spawn(gpu=0, mib=1000, behaviour="hidden")
    async with sweeper(settings_for(fleet, pg_url), fake=fake_slack) as svc:
        await svc.run()
        second = await svc.run()
    assert len(second.alerted) == 3
    by_node = {}
    for body in posts(fake_slack):
        by_node[body["text"].split(":")[0]] = body
    assert set(by_node) == {"⚠ node3", "⚠ node4"}
    text3 = all_text(by_node["⚠ node3"])
    assert "GPU 0: orphaned GPU memory" in text3 and "GPU 1: orphaned GPU memory" in text3
    assert "2048 MiB" in text3 and "2049 MiB" in text3
    assert "hidden GPU holder" in all_text(by_node["⚠ node4"])


async def test_snooze_and_a_restart_keep_their_word(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    hidden = fleet.node("node4").spawn(gpu=0, mib=1000, behaviour="hidden")
    key = ("node4", 0, "hidden-holder", f"{hidden.pid}:{hidden.start_ticks}")
    clock = ManualClock()
    settings = settings_for(fleet, pg_url)
    async with sweeper(settings, fake=fake_slack, clock=clock) as svc:
        await svc.run()
        clock.advance(300)
        assert [tuple(k) for k in (await svc.run()).alerted] == [key]
        ts = fake_slack.ok("chat.postMessage")[0].answer["ts"]
        snoozed = await keeper(svc).snooze(FindingKey(*key).text(), "1h", by="slack:U0CAROL")
        assert snoozed.snoozed_until is not None
        (update,) = [c.body for c in fake_slack.ok("chat.update")]
        assert update["ts"] == ts and "snoozed until" in all_text(update)
        clock.advance(1800)
        assert (await svc.run()).reminded == ()
    # gpubot restarts: a new process (new service, new connections) on the same database
    async with sweeper(settings, fake=fake_slack, clock=clock) as svc2:
        clock.advance(1900)  # the snooze is over: a reminder, not a second alert
        after = await svc2.run()
        assert after.alerted == () and [tuple(k) for k in after.reminded] == [key]
        assert [c.body.get("thread_ts") for c in fake_slack.ok("chat.postMessage")] == [None, ts]
        clock.advance(300)
        assert (await svc2.run()).reminded == ()
        kill_and_wait(hidden.pid)
        clock.advance(300)
        assert (await svc2.run()).resolved == ()  # cleared for one sweep: held (hysteresis)
        clock.advance(300)
        assert [tuple(k) for k in (await svc2.run()).resolved] == [key]
        last = fake_slack.ok("chat.update")[-1].body
        assert last["ts"] == ts and "*resolved* after 1 h 21 min" in all_text(last)
        records = [r for r in await svc2.audit.records() if r.kind == "alert"]  # type: ignore[union-attr]
        assert [r.data["alert"] for r in records] == ["alerted", "snoozed", "reminded", "resolved"]
        assert records[1].actor == "slack:U0CAROL"
    assert_within_limits(fake_slack)


async def test_no_alert_is_lost_when_slack_refuses(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    w = fleet.node("node2").spawn(gpu=1, mib=3000, behaviour="orphan")
    kill_and_wait(w.pid)
    fake_slack.fail("chat.postMessage", "channel_not_found")
    async with sweeper(settings_for(fleet, pg_url), fake=fake_slack) as svc:
        await svc.run()
        assert (await svc.run()).alerted == ()  # Slack said no: not marked as alerted
        assert len((await svc.run()).alerted) == 1  # the next sweep tries again
    assert len(posts(fake_slack)) == 1


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_sweep(fleet: SimFleet, tmp_path: Path) -> None:
    w = fleet.node("node1").spawn(gpu=1, mib=5000, behaviour="orphan")
    kill_and_wait(w.pid)
    fleet.node("node3").stop_server()
    config = tmp_path / "gpubot.toml"
    text = fleet.config_path.read_text()
    config.write_text(text.replace("[ssh]\n", "[ssh]\nconnect_timeout_s = 2\n"))
    env = {**os.environ, "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "gpubot", "--config", str(config), "sweep"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert {(f["node"], f["gpu"], f["kind"]) for f in doc["findings"]} == {
        ("node1", 1, "orphaned-vram"),
        ("node3", None, "node-unreachable"),
    }
    assert doc["failed"]["node3"]["kind"] == "node-unreachable"
    (orphaned,) = [f for f in doc["findings"] if f["kind"] == "orphaned-vram"]
    assert orphaned["readiness"]["nvlink_peers"] is None
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\n[sweep]\ninterval_s = -5\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(bad), "sweep"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"gpubot: error: {bad}: sweep.interval_s: expected a number > 0, got -5"
    ]
