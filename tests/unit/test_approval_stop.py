"""Stopping gpubot mid-grace never makes an approved kill silent (approved means run or told).

A retried reset runs in the approval duty's schedule. A stop lets that run end for the stop's
wait (``APPROVAL_STOP_WAIT_S``), then cancels it: SIGTERM has gone out, but no SIGKILL and no
verify. Such an approval is left ``approved``, so the interrupted look (on the duty's next run,
or at start-up) marks it ``incomplete`` and tells its thread and its requester once. The
control: recorded ``failed`` (``CancelledError()``), as before, nothing ever tells anyone.

The real reset engine runs over the scripted transport (the node answers the recorded probe,
and its target ignores SIGTERM), with the memory store, in-process leases and a virtual clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.app.duties import APPROVAL_STOP_WAIT_S
from gpubot.chat.approval_words import ApprovalWords
from gpubot.chat.message import Message
from gpubot.config import parse
from gpubot.core.alerting import MessageRef
from gpubot.core.approval.model import Approval
from gpubot.core.approval.posts import Purpose
from gpubot.core.commands import MAX_GRACE_S
from gpubot.core.models import ActionStatus, ApprovalState, CommandResult
from gpubot.core.policy import Person
from gpubot.core.ports import Report
from gpubot.errors import LockHeld
from gpubot.scheduler import IntervalScheduler
from gpubot.services.approval_duty import ApprovalDuty
from gpubot.services.approvals import ApprovalPorts, ApprovalService
from gpubot.services.locks import NodeLocks
from gpubot.services.outbox import Outbox
from gpubot.services.reset import Ask, ResetService, reset_lock
from gpubot.services.startup import report_interrupted
from gpubot.services.status import StatusService
from gpubot.store import Store, open_store
from gpubot.transport import ScriptedTransport
from gpubot.transport.scripted import Call, answer, completed
from tests.fixtures.approvals import REQUEST, Poster
from tests.fixtures.clock import VirtualClock

S = ApprovalState
CAROL = Person("U0CAROL", "carol", "carol")  # on call
EXPIRY_S = 900.0
SETTLED_S = 30.0
PROBE = Path(__file__).parents[1] / "fixtures" / "probe_outputs" / "sim-two-users-gpu1.json"
LONG = replace(REQUEST, grace_s=MAX_GRACE_S)  # bob's job is given the longest grace there is


def probe() -> tuple[str, CommandResult]:
    """Return the recorded node's device prefix and its answer to the probe."""
    doc: dict[str, Any] = json.loads(PROBE.read_text(encoding="utf-8"))
    (got,) = [c for c in doc["calls"] if c["program"] == "gpubot-probe"]
    return doc["dev_prefix"], completed((), got["stdout"], got["stderr"], got["exit_status"])


@dataclass
class Told:
    """The start-up report's ``Reporter``: keeps what it was told."""

    reports: list[Report] = field(default_factory=list)

    async def report(self, report: Report) -> None:
        self.reports.append(report)


@dataclass
class Bot:
    store: Store
    clock: VirtualClock
    locks: NodeLocks
    approvals: ApprovalService
    duty: ApprovalDuty[Message]
    poster: Poster
    signals: list[str]  # the signals sent to the node ("TERM", "check", "KILL"), in order
    term: asyncio.Event  # set once SIGTERM went out

    async def waiting(self) -> Approval:
        """A forced kill of bob's job asked by alice, approved by carol while the node was
        busy: it waits for the approval duty to retry it."""
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        a = await self.store.approvals.create(
            "U0ALICE", "alice", "node3", LONG, EXPIRY_S, source="slack", now=now
        )
        await self.store.approvals.set_message(a.id, MessageRef("C0ONCALL/1.0"))
        a = await self.approvals.decide(a.id, Ask(CAROL, f"approve {a.id}", "slack"), True)
        async with self.locks.hold(reset_lock("node3"), holder="bob's own reset"):
            with pytest.raises(LockHeld):
                await self.approvals.execute(a, source="slack")
        return a

    async def state(self, a: Approval) -> Approval:
        found = await self.store.approvals.get(a.id)
        assert found is not None
        return found


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def bot(store: Store) -> AsyncIterator[Bot]:
    clock, signals, term = VirtualClock(), list[str](), asyncio.Event()
    prefix, probed = probe()
    settings = parse(
        {
            "nodes": [{"name": "node3", "host": "node3.lab", "dev_prefix": prefix}],
            "approvals": {"approvers": ["U0CAROL"], "expiry_s": EXPIRY_S},
            "slack": {"oncall_channel": "C0ONCALL"},
        },
        "stop.toml",
    )

    def signal(call: Call) -> CommandResult:  # bob's job ignores SIGTERM
        sig = call.argv[call.argv.index("gpubot-signal") + 1]
        signals.append(sig)
        if sig == "TERM":
            term.set()
        return completed((), "4242 sent\n" if sig != "check" else "4242 alive S 0\n")

    transport = ScriptedTransport(answer({"gpubot-probe": probed, "gpubot-signal": signal}))
    locks = NodeLocks(clock)
    status = StatusService(settings, transport, store)
    reset = ResetService(settings, transport, store, status, locks, clock=clock)
    ports = ApprovalPorts(store.approvals, reset, store, clock=clock)
    approvals = ApprovalService(settings.policy, ports)
    poster = Poster(store)
    outbox = Outbox(store.outbox, poster, clock=clock)
    words = ApprovalWords(settings.policy.expiry_s)
    duty = ApprovalDuty(approvals, outbox, words, front="slack", settled_s=SETTLED_S)
    yield Bot(store, clock, locks, approvals, duty, poster, signals, term)


async def stopped_mid_grace(bot: Bot) -> Approval:
    """Retry the waiting kill in the approval duty's schedule, then stop the schedule mid-grace
    (as ``App.running`` does on SIGTERM); return the approval as the stop leaves it."""
    a = await bot.waiting()
    schedule = IntervalScheduler(
        bot.duty.look_again,
        30,
        first_after_s=0,
        stop_wait_s=APPROVAL_STOP_WAIT_S,
        name="approval-expiry",
        clock=bot.clock,
    )
    schedule.start()
    await bot.clock.advance(0)  # the duty's run starts at once
    await bot.term.wait()  # its retry took the approval: SIGTERM went out, the grace runs
    assert bot.signals == ["TERM"]
    assert (await bot.state(a)).state is S.APPROVED and a.id in bot.approvals.running
    stop = asyncio.ensure_future(schedule.stop())
    await bot.clock.advance(APPROVAL_STOP_WAIT_S)  # the grace outlasts the stop's wait
    await stop
    assert not schedule.running and "KILL" not in bot.signals  # cut mid-grace
    (action,) = await bot.store.actions()
    assert action.status == ActionStatus.ERROR  # the reset's own record says it was cut
    return await bot.state(a)


async def test_a_stop_mid_grace_leaves_it_approved_and_the_next_look_tells_it_once(
    bot: Bot,
) -> None:
    a = await stopped_mid_grace(bot)
    assert a.state is S.APPROVED and a.id not in bot.approvals.running
    await bot.clock.advance(SETTLED_S + 1)
    (marked,) = await bot.duty.look_again()
    assert marked.id == a.id and marked.state is S.INCOMPLETE
    (thread,) = bot.poster.of(Purpose.INTERRUPTED)
    assert thread[1:3] == ("C0ONCALL", "1.0") and "was interrupted" in thread[3]
    (dm,) = bot.poster.of(Purpose.INTERRUPTED_DM)
    assert dm[1] == "D-U0ALICE"
    told = len(bot.poster.posts)
    assert await bot.duty.look_again() == [] and len(bot.poster.posts) == told  # once
    assert bot.signals.count("TERM") == 1  # an interrupted kill is never run again


async def test_a_stop_mid_grace_is_reported_at_start_up_and_told_in_its_thread_once(
    bot: Bot,
) -> None:
    a = await stopped_mid_grace(bot)
    told = Told()
    (report,) = await report_interrupted(None, bot.approvals, told)  # the restarted bot
    assert report.title == "Incomplete approvals" and f"approval #{a.id}" in report.text()
    assert [x.id for x in await bot.duty.look_again()] == [a.id]
    assert len(bot.poster.of(Purpose.INTERRUPTED)) == 1
    assert await bot.duty.look_again() == [] and len(bot.poster.of(Purpose.INTERRUPTED)) == 1


async def test_control_recorded_as_failed_nobody_is_ever_told(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpubot.services.approvals.stopped", lambda exc: False)  # as before
    a = await stopped_mid_grace(bot)
    assert a.state is S.FAILED and a.result == {"error": "CancelledError()"}
    await bot.clock.advance(SETTLED_S + 1)
    assert await report_interrupted(None, bot.approvals, Told()) == []
    assert await bot.duty.look_again() == []
    assert bot.poster.of(Purpose.INTERRUPTED) == bot.poster.of(Purpose.INTERRUPTED_DM) == []


def test_the_stop_wait_covers_a_default_reset_and_ends_before_systemds_kill() -> None:
    r = parse({"nodes": [{"name": "node3", "host": "node3.lab"}]}, "stop.toml").reset
    assert r.grace_s + 5.0 + r.verify_timeout_s <= APPROVAL_STOP_WAIT_S  # grace, SIGKILL, verify
    unit = Path(__file__).parents[2] / "deploy" / "gpubot.service"
    (line,) = [x for x in unit.read_text(encoding="utf-8").splitlines() if "TimeoutStopSec=" in x]
    stop_kill_s = float(line.split("=")[1].rstrip("s"))
    assert stop_kill_s > APPROVAL_STOP_WAIT_S
