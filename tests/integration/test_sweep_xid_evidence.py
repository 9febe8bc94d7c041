"""Issue 34 on the simulated fleet over real SSH: Xid evidence per process, and a kernel log
nobody can flood.

The nodes' stand-in ``journalctl``/``dmesg`` (``gpusim.kernlog``) answer from the lines the test
writes; the read is the real script under the node's bash, the sweep the real service with its
kernel-log watch, Slack the loopback fake. mallory (another uid: root only) faults on bob's GPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpubot.core.alerting import SweepResult
from gpubot.core.health.codes import DRAIN_REBOOT, RESET_WHEN_IDLE, TELL_OWNER
from gpubot.core.health.kernlog import MAX_APP_LINES, MAX_ENTRIES, MAX_LINES, parse_event
from gpubot.services.sweep import SweepService
from gpubot.services.xid_watch import MAX_STEPS, XidWatch
from gpubot.slack.alerts import SlackAlerts
from gpubot.slack.api import SlackApi, make_client
from gpusim.fleet import SimFleet
from gpusim.kernlog import records
from tests.fixtures.db import temp_database
from tests.fixtures.settings import ManualClock, sweep_ports, with_tables
from tests.fixtures.slack import BOT_TOKEN, FakeSlack

CHANNEL = "C0ALERTS"
PEOPLE = ("mallory", "bob", "dana")
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    people = PEOPLE if ROOT else ()  # another uid needs root
    root = tmp_path_factory.mktemp("xidev")
    with SimFleet(root, nodes=1, gpus=4, release_delay_s=0.2, people=people) as f:
        yield f


@pytest.fixture(autouse=True)
def clean(fleet: SimFleet) -> Iterator[None]:
    yield
    for n in fleet.nodes:
        n.clear()


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("sqlite", tmp_path) as url:
        yield url


@asynccontextmanager
async def sweeper(
    fleet: SimFleet,
    db_url: str,
    fake: FakeSlack | None,
    entries: int = MAX_ENTRIES,
    steps: int = MAX_STEPS,
) -> AsyncIterator[Sweep]:
    """The real composition with a sweep service and its kernel-log watch."""
    s = load(fleet.config_path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=10.0, connect_timeout_s=5.0)
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh)
    settings: Settings = with_tables(
        s, {"sweep": {"interval_s": 60, "kernel_log": True}, "alerts": {"channel": CHANNEL}}
    )
    app = build(settings, {}, need_store=True)
    notifier = None
    if fake is not None:
        notifier = SlackAlerts(SlackApi(make_client(BOT_TOKEN, fake.base_url)), CHANNEL)
    clock = ManualClock()
    ports = sweep_ports(settings, app.store, notifier=notifier, clock=clock)
    watch = XidWatch(app.transport, clock=clock, entries=entries, steps=steps)
    app.status.decorators.append(watch.flag)  # as services.xid_watch.watch_for wires it
    ports = dataclasses.replace(ports, xid=watch)
    svc = SweepService(settings, app.status, app.transport, ports, clock=clock, replica="test")
    try:
        yield Sweep(svc, watch)
    finally:
        await app.close()


@dataclasses.dataclass
class Sweep:
    svc: SweepService
    watch: XidWatch


def xids(result: SweepResult) -> dict[tuple[int | None, str], str | None]:
    return {
        (f.gpu, f.key.holder): f.next_step for f in result.findings if f.kind.value == "gpu-xid"
    }


def reset_offers(fake: FakeSlack) -> list[str]:
    """The values ("node:gpu") of the *Reset GPU* buttons posted anywhere."""
    out = []
    for c in fake.ok("chat.postMessage"):
        blocks = c.body.get("blocks") or []
        for b in json.loads(blocks) if isinstance(blocks, str) else blocks:
            for e in b.get("elements", []) if b.get("type") == "actions" else []:
                if e.get("action_id") == "gpubot_reset_gpu":
                    out.append(str(e.get("value")))
    return out


@pytest.mark.skipif(not ROOT, reason="another uid needs root")
@pytest.mark.parametrize("who", ["one process", "three owners"])
async def test_a_burst_is_on_calls_only_across_processes_or_owners(
    fleet: SimFleet, db_url: str, fake_slack: FakeSlack, who: str
) -> None:
    n1 = fleet.node("node1")
    bob = n1.spawn(gpu=0, mib=30_000, user="bob")  # bob's 30 GB job: GPU 0 is his
    mallory = n1.spawn(gpu=0, mib=256, user="mallory")  # a context on bob's GPU
    if who == "one process":
        pids = [mallory.pid] * 5
    else:  # the control: the same five lines from three owners' processes
        dana = n1.spawn(gpu=0, mib=256, user="dana")
        pids = [mallory.pid, bob.pid, dana.pid, mallory.pid, bob.pid]
    for pid in pids:
        n1.kernel.xid(0, 13, pid=pid, name="python3")
    async with sweeper(fleet, db_url, fake_slack) as s:
        result = await s.svc.run()
    f = next(f for f in result.findings if f.key.holder == "xid:13")
    if who == "one process":
        assert xids(result) == {(0, "xid:13"): TELL_OWNER}  # no burst for on-call
        assert f.owner == "mallory"  # the faulting process's owner, never bob
        assert f"pid `{mallory.pid}` `python3` (`mallory`'s) ×5" in f.summary
        assert fake_slack.ok("chat.postMessage")  # the alert was posted ...
        assert reset_offers(fake_slack) == []  # ... with no reset of bob's GPU
    else:
        assert xids(result)[(0, "xid:13:burst")] == RESET_WHEN_IDLE
        burst = next(f for f in result.findings if f.key.holder == "xid:13:burst")
        assert "raised by 3 processes of 3 owners" in burst.summary
        assert reset_offers(fake_slack) == ["node1:0"]
    for w in (bob, mallory):  # nothing was signalled
        os.kill(w.pid, 0)


@pytest.mark.parametrize("mode", ["journal", "dmesg"])
async def test_a_flood_of_application_lines_never_hides_an_xid_79(
    fleet: SimFleet, db_url: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    n1 = fleet.node("node1")
    n1.kernel.set_mode(mode)
    job = n1.spawn(gpu=0, mib=1024)
    n1.kernel.xid(2, 79)  # GPU 2 falls off the bus ...
    for _ in range(450):  # ... and then a job's own faults flood the log
        n1.kernel.xid(0, 13, pid=job.pid, name="python3")
    driver = [m for _, _, m in records(str(n1.kernel.state_dir)) if parse_event(m) is not None]
    assert not any(": 79, " in m for m in driver[-MAX_LINES:])  # control: the old cap lost it
    caplog.set_level(logging.WARNING, logger="gpubot.services.xid_watch")
    async with sweeper(fleet, db_url, None) as s:
        result = await s.svc.run(alerting=False)
        status = await s.svc.status.fleet(["node1"])
        other = n1.spawn(gpu=1, mib=1024)
        for _ in range(150):  # a second read: 150 new lines on GPU 1, the rest seen already
            n1.kernel.xid(1, 13, pid=other.pid, name="python3")
        again = await s.svc.run(alerting=False)
    gpu0, gpu1 = (
        next(f for f in again.findings if (f.gpu, f.key.holder) == (g, "xid:13")) for g in (0, 1)
    )
    assert "450 in the window (350 of them summarised" in gpu0.summary  # not summarised again
    assert "150 in the window (50 of them summarised" in gpu1.summary
    assert xids(result)[(2, "xid:79")] == DRAIN_REBOOT
    app = next(f for f in result.findings if f.key.holder == "xid:13")
    dropped = 450 - MAX_APP_LINES
    assert f"450 in the window ({dropped} of them summarised" in app.summary
    note = f"kernel log: {dropped} application-error lines summarised"
    assert any(note in r.getMessage() for r in caplog.records)
    (snap,) = status.snapshots
    assert note in snap.notes  # the node's note beside its status


@pytest.mark.parametrize(("steps", "want"), [(MAX_STEPS, [True] * 3), (1, [False, False, True])])
async def test_a_journal_backlog_is_read_in_bounded_steps_and_a_79_past_the_cap_found(
    fleet: SimFleet, db_url: str, steps: int, want: list[bool]
) -> None:
    """450 of a job's own lines, then GPU 2 falls off the bus; each step takes 200 entries
    (journalctl -n after the cursor) and a full step is followed by the next within the read's
    budget: the 79 is found on the first sweep (control, one step a sweep: on the third)."""
    n1 = fleet.node("node1")
    n1.kernel.set_mode("journal")
    job = n1.spawn(gpu=0, mib=1024)
    for _ in range(450):
        n1.kernel.xid(0, 13, pid=job.pid, name="python3")
    n1.kernel.xid(2, 79)
    async with sweeper(fleet, db_url, None, entries=200, steps=steps) as s:
        found = [xids(await s.svc.run(alerting=False)) for _ in range(3)]
    assert [(2, "xid:79") in x for x in found] == want
    assert found[2][(2, "xid:79")] == DRAIN_REBOOT
