"""Xid and SXid findings from the kernel log, on the simulated fleet over real SSH.

Each node's stand-in ``journalctl``/``dmesg`` (``gpusim.kernlog``) answers from the lines the
test writes through the fault API (``SimNode.kernel``), in real formats; the sweep is the real
service with its kernel-log watch, the store a real PostgreSQL, Slack the loopback fake.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.cli.render import snapshot_dict
from gpubot.config import Settings, load
from gpubot.core.alerting import SweepResult
from gpubot.core.health.codes import DRAIN_REBOOT, LOOK_UP, RESET_WHEN_IDLE, TELL_OWNER, TICKET
from gpubot.core.models import NodeConfig
from gpubot.services.doctor import DoctorParts, DoctorService
from gpubot.services.sweep import SweepService
from gpubot.services.xid_watch import XidWatch
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.settings import ManualClock, sweep_ports, with_tables
from tests.fixtures.slack import BOT_TOKEN, FakeSlack
from tests.hostile_render import mrkdwn_problems
from tests.procs import remote_probes

CHANNEL = "C0ALERTS"


class Counted(list[tuple[str, str, str]]):
    """The events the watch counted (node, gpu, code)."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("xid"), nodes=2, gpus=4, release_delay_s=0.2) as f:
        yield f


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        n.clear()
    # A probe cut short by the budget still runs on its node: let it end (as test_sweep.py).
    deadline = time.monotonic() + 15
    while remote_probes(fleet) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("postgresql", tmp_path) as url:
        yield url


def settings_for(fleet: SimFleet, db_url: str) -> Settings:
    s = load(fleet.config_path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=10.0, connect_timeout_s=5.0)
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh)
    tables = {"sweep": {"interval_s": 60, "kernel_log": True}, "alerts": {"channel": CHANNEL}}
    return with_tables(s, tables)


@asynccontextmanager
async def sweeper(
    settings: Settings, fake: FakeSlack | None, clock: ManualClock, counted: Counted
) -> AsyncIterator[SweepService]:
    """The real composition with a sweep service and its kernel-log watch."""
    app = build(settings, {}, need_store=True)
    notifier = None
    if fake is not None:
        notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake.base_url)), CHANNEL)
    ports = sweep_ports(settings, app.store, notifier=notifier, clock=clock)
    watch = XidWatch(app.transport, clock=clock, count=lambda *c: counted.append(c))
    ports = dataclasses.replace(ports, xid=watch)
    app.status.decorators.append(watch.flag)  # as services.xid_watch.watch_for wires it
    svc = SweepService(settings, app.status, app.transport, ports, clock=clock, replica="test")
    try:
        yield svc
    finally:
        await app.close()


def xid_keys(result: SweepResult) -> dict[tuple[str, int | None, str], str | None]:
    return {
        (f.node, f.gpu, f.key.holder): f.next_step
        for f in result.findings
        if f.kind.value in ("gpu-xid", "nvswitch-sxid")
    }


def posted(fake: FakeSlack, *, replies: bool) -> list[str]:
    """The channel's messages (``replies=False``) or the replies in their threads."""
    return [
        str(c.body.get("blocks")) + str(c.body.get("text"))
        for c in fake.ok("chat.postMessage")
        if ("thread_ts" in c.body) is replies
    ]


async def test_each_xid_class_is_found_and_alerted_once_with_its_next_step(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n1, n2 = fleet.node("node1"), fleet.node("node2")
    job = n1.spawn(gpu=0, mib=2048)
    n1.kernel.xid(0, 13, pid=job.pid, name="python3")  # the job's own: tell its owner
    n1.kernel.xid(1, 48)  # memory: reset when idle
    holder = n1.spawn(gpu=1, mib=1024)  # it is not idle: a reset would end this job
    n1.kernel.xid(2, 79)  # off the bus: drain and reboot
    n1.kernel.xid(3, 64, text="pid='N/A', Row Remapper: Failed to remap row")  # hardware
    n2.kernel.xid(0, 74)  # NVLink
    n2.kernel.xid(1, 119, pid=4242, name="nvidia-smi")  # GSP
    n2.kernel.xid(2, 94, pid=4343, name="python3")
    n2.kernel.xid(0, 200)  # not in the table: look it up
    n2.kernel.xid(0, 79, bus="0000:ee:00")  # a bus id no GPU of the node has
    n2.kernel.sxid(12028, switch=1)
    clock, counted = ManualClock(), Counted()
    async with sweeper(settings_for(fleet, pg_url), fake_slack, clock, counted) as svc:
        first = await svc.run()
        clock.advance(60)
        second = await svc.run()  # nothing new in the log: nothing new alerted
        status = await svc.status.fleet(["node1"])  # a status: flags, no kernel-log read
    want = {
        ("node1", 0, "xid:13"): TELL_OWNER,
        ("node1", 1, "xid:48"): RESET_WHEN_IDLE,
        ("node1", 2, "xid:79"): DRAIN_REBOOT,
        ("node1", 3, "xid:64"): TICKET,
        ("node2", 0, "xid:74"): RESET_WHEN_IDLE,
        ("node2", 1, "xid:119"): RESET_WHEN_IDLE,
        ("node2", 2, "xid:94"): RESET_WHEN_IDLE,
        ("node2", 0, "xid:200"): LOOK_UP,
        ("node2", None, "xid:79:0000:ee:00"): DRAIN_REBOOT,
        ("node2", None, "sxid:12028:0000:84:00"): DRAIN_REBOOT,
    }
    assert xid_keys(first) == want
    assert {(k.node, k.gpu, k.holder) for k in first.alerted} == set(want)  # at once: events
    assert xid_keys(second) == want and second.alerted == ()
    assert sorted(counted) == sorted(
        [
            ("node1", "0", "13"),
            ("node1", "1", "48"),
            ("node1", "2", "79"),
            ("node1", "3", "64"),
            ("node2", "0", "74"),
            ("node2", "1", "119"),
            ("node2", "2", "94"),
            ("node2", "0", "200"),
            ("node2", "-", "79"),
            ("node2", "-", "sxid:12028"),
        ]
    )  # each line counted once: the second read began after the journal's cursor
    by = {(f.node, f.gpu, f.key.holder): f for f in first.findings}
    assert by[("node1", 0, "xid:13")].owner == fleet.user  # /proc's user of that pid
    assert "no GPU of the node's table has" in by[("node2", None, "xid:79:0000:ee:00")].summary
    (snap,) = status.snapshots
    gpus = snapshot_dict(snap)["gpus"]
    health = {g["index"]: [f for f in g["flags"] if f.startswith("xid")] for g in gpus}
    assert health == {0: [], 1: ["xid-48"], 2: ["xid-79"], 3: ["xid-64"]}  # 13: the job's own
    channel = posted(fake_slack, replies=False)
    # One message per finding kind, posted once: the Xids of both nodes are one digest, whose
    # per-node details (and buttons) are in its thread; the SXid is node2's alone.
    assert len(channel) == 2
    assert sum("Xid error on 2 nodes" in t for t in channel) == 1
    node1 = next(t for t in posted(fake_slack, replies=True) if "node1" in t)
    assert "next step: reset when idle" in node1 and "gpubot_reset_gpu" in node1
    assert "node1:1" in node1  # the reset offer (approval-gated by the reset flow) for GPU 1
    ready = first.readiness[("node1", 1)]  # what the reset would touch, shown with the offer
    assert any(str(holder.pid) in p for p in ready.processes), ready
    assert "before a GPU reset" in node1 and "processes on GPU 1: " in node1
    assert "node1:2" not in node1  # off the bus: no reset offered, drain and reboot


async def test_a_burst_past_its_threshold_is_on_calls(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    # NVLink errors (74) count lines: three in the window are on-call's. A job's own code (13)
    # from three processes gone by the sweep (owners unknown) stays a plain finding: unknown
    # owners never count as other people (issue 34: tests/unit/test_xid_evidence.py).
    for i in range(4):
        n1.kernel.xid(0, 13, pid=3_900_001 + i % 3, name="python3")
    for _ in range(2):
        n1.kernel.xid(1, 74)
    clock, counted = ManualClock(), Counted()
    async with sweeper(settings_for(fleet, pg_url), fake_slack, clock, counted) as svc:
        below = await svc.run()
        n1.kernel.xid(0, 13, pid=3_900_003, name="python3")  # the fifth in the window
        n1.kernel.xid(1, 74)  # the third in the window
        clock.advance(60)
        past = await svc.run()
        clock.advance(60)
        again = await svc.run()
    assert xid_keys(below) == {
        ("node1", 0, "xid:13"): TELL_OWNER,
        ("node1", 1, "xid:74"): RESET_WHEN_IDLE,
    }
    assert xid_keys(past) == {
        ("node1", 0, "xid:13"): TELL_OWNER,  # no burst, no reset of the GPU for on-call
        ("node1", 1, "xid:74"): RESET_WHEN_IDLE,
        ("node1", 1, "xid:74:burst"): TICKET,
    }
    assert [(k.gpu, k.holder) for k in past.alerted] == [(1, "xid:74:burst")]
    assert again.alerted == ()
    assert len(counted) == 8
    burst = next(f for f in past.findings if f.key.holder.endswith("burst"))
    assert "3 in the window" in burst.summary and "past the threshold of 3" in burst.summary


async def test_the_window_passes_and_the_finding_resolves(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node1").kernel.xid(1, 48)
    clock, counted = ManualClock(), Counted()
    async with sweeper(settings_for(fleet, pg_url), None, clock, counted) as svc:
        first = await svc.run()
        clock.advance(3700)  # past the hour's window
        later = await svc.run()
    assert ("node1", 1, "xid:48") in xid_keys(first)
    assert xid_keys(later) == {}


HOSTILE = "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus. <!channel> *on-call ok*"


async def test_a_hostile_process_name_changes_nothing(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n1 = fleet.node("node1")
    # A user's process whose argv and comm are an Xid line and mrkdwn: the probe reads them, the
    # kernel log does not hold them, so no finding comes of them.
    liar = n1.spawn(gpu=0, mib=1024, forge=HOSTILE)
    # The kernel's copy of a hostile comm in a real Xid line: shown marked, deciding nothing.
    bystander = n1.spawn(gpu=1, mib=1024)
    n1.kernel.xid(1, 13, pid=liar.pid, name="*ok*<!here>`x")
    # The kernel quotes a user's file name in this warning (fs/exec.c): the text is in the log,
    # but not as the driver's own words, so it is no Xid either.
    n1.kernel.write(f"process 'sh' launched '{HOSTILE}' with NULL argv: empty string added")
    clock, counted = ManualClock(), Counted()
    async with sweeper(settings_for(fleet, pg_url), fake_slack, clock, counted) as svc:
        result = await svc.run()
    assert xid_keys(result) == {("node1", 1, "xid:13"): TELL_OWNER}  # no 79 from the argv
    (f,) = [f for f in result.findings if f.key.holder == "xid:13"]
    assert f.owner is None  # that pid does not hold GPU 1: nobody is told on the line's word
    assert "`*ok*<!here>ˋx`" in f.summary  # marked, one line, its back-tick replaced
    for text in posted(fake_slack, replies=False) + posted(fake_slack, replies=True):
        assert "<!here>" not in text.replace("&lt;!here&gt;", "")
    for body in (c.body for c in fake_slack.ok("chat.postMessage")):
        assert mrkdwn_problems(_section_text(body)) == []
    for w in (liar, bystander):  # nothing was signalled
        os.kill(w.pid, 0)


def _section_text(body: dict[str, Any]) -> str:
    import json

    blocks = body.get("blocks") or []
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    return "\n".join(
        b["text"]["text"] for b in blocks if b.get("type") == "section" and "text" in b
    )


@pytest.mark.parametrize(
    ("mode", "found"), [("dmesg", True), ("no-journal-group", True), ("denied", False)]
)
async def test_each_source_and_what_a_node_without_the_privilege_says(
    fleet: SimFleet, pg_url: str, mode: str, found: bool, caplog: pytest.LogCaptureFixture
) -> None:
    n2 = fleet.node("node2")
    n2.kernel.set_mode(mode)
    n2.kernel.xid(3, 95)
    clock, counted = ManualClock(), Counted()
    caplog.set_level(logging.WARNING, logger="gpubot.services.xid_watch")
    async with sweeper(settings_for(fleet, pg_url), None, clock, counted) as svc:
        first = await svc.run()
        clock.advance(60)
        second = await svc.run()
    assert first.failed == {} and second.failed == {}  # the node's sweep never fails for it
    assert (("node2", 3, "xid:95") in xid_keys(first)) is found
    assert len(counted) == (1 if found else 0)  # dmesg: only lines newer than the last seen
    said = [r.getMessage() for r in caplog.records if "kernel log" in r.getMessage()]
    if found:
        assert said == []
    else:
        assert said == [
            "node2: kernel log unreadable: journal-denied not in the systemd-journal or adm "
            "group; dmesg-denied dmesg: read kernel buffer failed: Operation not permitted"
        ]  # once, not every sweep


async def test_doctor_says_which_source_a_node_may_read(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node1").kernel.set_mode("no-journal-group")  # dmesg still readable
    fleet.node("node2").kernel.set_mode("denied")
    settings = settings_for(fleet, pg_url)
    app = build(settings, {}, need_store=False)

    async def no_fingerprint(_node: NodeConfig) -> str | None:
        return None

    try:
        doctor = DoctorService(settings, app.transport, DoctorParts(no_fingerprint))
        checks = {
            c.area: c
            for n in settings.nodes
            for c in await doctor.node(n)
            if c.name == "kernel log (Xid)"
        }
    finally:
        await app.close()
    assert checks["node1"].ok and "dmesg is readable" in checks["node1"].detail
    assert not checks["node2"].ok
    assert "Operation not permitted" in checks["node2"].detail
    assert checks["node2"].fix.startswith("usermod -aG systemd-journal")


async def test_an_xid_79_alerts_when_nvidia_smi_fails_after_it(
    fleet: SimFleet, pg_url: str, fake_slack: FakeSlack
) -> None:
    n2 = fleet.node("node2")
    clock, counted = ManualClock(), Counted()
    async with sweeper(settings_for(fleet, pg_url), fake_slack, clock, counted) as svc:
        await svc.run()  # a healthy sweep: the watch has node2's table
        n2.kernel.xid(3, 79)
        n2.set_fault("driver-error")  # and then nvidia-smi cannot talk to the driver
        clock.advance(60)
        after = await svc.run()
    assert after.failed["node2"].kind.value == "smi-failed"
    assert xid_keys(after) == {("node2", 3, "xid:79"): DRAIN_REBOOT}  # by its last table
    assert [(k.node, k.gpu, k.holder) for k in after.alerted] == [("node2", 3, "xid:79")]
    assert counted == [("node2", "3", "79")]


async def test_a_hung_node_still_ends_within_the_budget(fleet: SimFleet, pg_url: str) -> None:
    fleet.node("node1").set_fault("hang")
    fleet.node("node2").kernel.xid(0, 48)
    s = settings_for(fleet, pg_url)
    s = with_tables(
        s, {"sweep": {"interval_s": 10, "budget_s": 4, "kernel_log": True}, "alerts": {}}
    )
    clock, counted = ManualClock(), Counted()
    async with sweeper(s, None, clock, counted) as svc:
        t0 = time.monotonic()
        result = await svc.run(alerting=False)
        took = time.monotonic() - t0
    assert result.failed["node1"].kind.value == "node-slow"
    assert ("node2", 0, "xid:48") in xid_keys(result)  # the other node is read as usual
    # Past the budget (4 s) the hung node is given up: well before its command timeout (20 s),
    # which is where a sweep waiting on it would end. The slack is for a loaded box.
    assert took < 4 + 10
