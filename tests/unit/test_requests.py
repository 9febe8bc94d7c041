"""``services.requests``: the reset-with-approval sequence, on fake approvals (milliseconds).

The approval service is a stand-in that records what it was asked; the request service's
outcomes and the events its sink gets are checked for each path.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any, cast

from gpubot.core import commands
from gpubot.core.approval.model import Approval, ApprovalRequest
from gpubot.core.models import ApprovalState, ResetStep
from gpubot.core.policy import Person, Policy
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import NotAnApprover, NotPermitted, StoreError
from gpubot.services.approvals import ApprovalService
from gpubot.services.requests import (
    Busy,
    Closed,
    Decided,
    Done,
    Failed,
    Pending,
    Planning,
    Refusal,
    Refused,
    RequestEvent,
    RequestService,
    Running,
)
from gpubot.services.reset import Ask, ResetEvent
from tests.fixtures.fleet_samples import plan_and_result

NOW = datetime(2026, 12, 1, tzinfo=UTC)
BOB = Person("U0BOB", "bob", "bob")
CAROL = Person("U0CAROL", "carol", "carol")


def forced(plan: ResetPlan, how: bool = True) -> ResetPlan:
    """Return ``plan`` with every target forced (it needs approval), or none (``how`` False)."""
    return dataclasses.replace(
        plan, targets=tuple(dataclasses.replace(t, forced=how) for t in plan.targets)
    )


def approval(plan: ResetPlan, state: ApprovalState = ApprovalState.PENDING) -> Approval:
    decided = None if state is ApprovalState.PENDING else "U0CAROL"
    unset: list[Any] = [None] * 6  # decided_by_name … message_ts
    return Approval(
        7,
        "U0BOB",
        "bob",
        "slack",
        plan.node,
        ApprovalRequest(plan),
        state,
        NOW,
        NOW,
        decided,
        *unset,
    )


class Store:
    def __init__(self) -> None:
        self.messages: list[tuple[int, str]] = []
        self.found: Approval | None = None

    async def set_message(self, approval_id: int, ref: str) -> None:
        self.messages.append((approval_id, ref))

    async def get(self, approval_id: int) -> Approval | None:
        return self.found


class FakeApprovals:
    """The calls ``RequestService`` makes of ``ApprovalService``, recorded."""

    def __init__(self, plan: ResetPlan, *, permitted: bool = True) -> None:
        self.the_plan = plan
        self.permitted = permitted
        self.approvals = Store()
        self.policy = Policy(min_uid=1000)
        self.refusals: list[tuple[str, str]] = []
        self.decision: Approval | None = None
        self.gate = asyncio.Event()
        self.gate.set()

    async def check_may_reset(self, who: Person, node: str) -> None:
        if not self.permitted:
            raise NotPermitted(f"you may not reset GPUs on {node}")

    async def plan(self, who: Person, cmd: Any) -> tuple[ResetPlan, None]:
        return self.the_plan, None

    async def run(self, ask: Ask, plan: ResetPlan, before: Any) -> Any:
        assert ask.on_event is not None
        await ask.on_event(ResetEvent(ResetStep.EXITED, 1.0, {"pid": 1}))
        return plan_and_result()

    async def open(self, ask: Ask, plan: ResetPlan) -> Approval:
        return approval(plan)

    async def decide(self, approval_id: int, ask: Ask, approve: bool) -> Approval:
        await self.gate.wait()
        if ask.who.id != "U0CAROL":
            raise NotAnApprover("only on-call approvers can decide")
        state = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        return approval(self.the_plan, state)

    async def check_decision(self, approval_id: int, who: Person, approve: bool) -> None:
        if who.id != "U0CAROL":
            raise NotAnApprover("only on-call approvers can decide")

    async def execute(self, a: Approval, **kw: Any) -> Any:
        await kw["on_event"](ResetEvent(ResetStep.EXITED, 1.0, {"pid": 1}))
        return plan_and_result()

    async def record_refusal(self, ask: Ask, **kw: Any) -> None:
        self.refusals.append((ask.who.id, kw["action"]))


def service(fake: FakeApprovals | None) -> RequestService:
    return RequestService(cast(ApprovalService | None, fake))


class Sink:
    def __init__(self) -> None:
        self.events: list[RequestEvent] = []

    async def __call__(self, event: RequestEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


RESET = commands.Reset("node1", gpus=(0,))
ASK = Ask(BOB, "/gpu reset node1 gpu 0", "console")


async def nowhere(a: Approval, plan: ResetPlan | NodeChange) -> Any:
    raise AssertionError("an own-process reset is never announced")


async def test_an_own_reset_plans_runs_and_reports() -> None:
    fake, sink = FakeApprovals(forced(plan_and_result().plan, False)), Sink()
    out = await service(fake).reset(ASK, RESET, sink, nowhere)
    assert isinstance(out, Done) and out.result.ok
    assert sink.kinds() == ["Planning", "Running", "ResetEvent"]
    assert isinstance(sink.events[1], Running) and sink.events[1].plan is fake.the_plan


async def test_a_refusal_is_told_and_audited_and_nothing_runs() -> None:
    fake, sink = FakeApprovals(plan_and_result().plan, permitted=False), Sink()
    out = await service(fake).reset(ASK, RESET, sink, nowhere)
    assert isinstance(out, Refused) and sink.kinds() == ["Refusal"]
    assert fake.refusals == [("U0BOB", "reset")]


async def test_a_forced_plan_is_announced_and_remembered() -> None:
    fake, sink = FakeApprovals(forced(plan_and_result().plan)), Sink()
    announced: list[int] = []

    async def announce(a: Approval, plan: ResetPlan | NodeChange) -> Any:
        announced.append(a.id)
        return "C0ONCALL/1.5"

    zed = Ask(Person("U0ZED", "zed", "zed"), "/gpu reset node1 gpu 0", "slack")
    out = await service(fake).reset(zed, RESET, sink, announce)
    assert isinstance(out, Pending) and out.posted and announced == [7]
    assert fake.approvals.messages == [(7, "C0ONCALL/1.5")]
    assert sink.kinds() == ["Planning"]  # nothing runs before an approver decides
    own = Sink()  # bob's own processes, forced (a uid below min_uid): refused, yet opened
    assert isinstance(await service(fake).reset(ASK, RESET, own, announce), Pending)
    assert own.kinds() == ["Planning", "Refusal"] and fake.refusals == [("U0BOB", "reset")]

    async def lost(a: Approval, plan: ResetPlan | NodeChange) -> Any:
        return None

    again = await service(fake).reset(zed, RESET, Sink(), lost)
    assert isinstance(again, Pending) and not again.posted
    assert len(fake.approvals.messages) == 2  # nothing more to remember


async def test_an_approval_runs_once_and_a_second_click_waits_or_is_refused() -> None:
    fake, sink = FakeApprovals(forced(plan_and_result().plan)), Sink()
    svc = service(fake)
    fake.gate.clear()
    first = asyncio.ensure_future(svc.decide(7, True, Ask(CAROL, "approve 7", "slack"), sink))
    await asyncio.sleep(0)
    assert isinstance(await svc.decide(7, True, Ask(CAROL, "approve 7", "slack"), Sink()), Busy)
    dave = Ask(Person("U0DAVE", "dave", "dave"), "approve 7", "slack")
    assert isinstance(await svc.decide(7, True, dave, Sink()), Refused)
    assert fake.refusals == [("U0DAVE", "approve")]  # refused even while in flight, audited
    fake.gate.set()
    out = await first
    assert isinstance(out, Done) and out.approval is not None
    assert sink.kinds() == ["Decided", "Running", "ResetEvent"]
    assert isinstance(sink.events[0], Decided) and sink.events[0].plan.node == "node1"
    assert svc.deciding == set()


async def test_a_denial_closes_the_request_without_running() -> None:
    fake, sink = FakeApprovals(forced(plan_and_result().plan)), Sink()
    out = await service(fake).decide(7, False, Ask(CAROL, "deny 7", "slack"), sink)
    assert isinstance(out, Closed) and sink.kinds() == ["Decided"]


async def test_without_approvals_a_request_fails_closed() -> None:
    nobody = await service(None).decide(7, True, Ask(CAROL, "approve 7", "slack"), Sink())
    assert isinstance(nobody, Failed) and isinstance(nobody.error, StoreError)
    sink = Sink()
    out = await service(None).reset(ASK, RESET, sink, nowhere)
    assert isinstance(out, Failed) and isinstance(out.error, StoreError)
    assert not [e for e in sink.events if isinstance(e, Planning | Running)]
    assert isinstance(await service(None).gpu_reset(ASK, commands.GpuReset("n", 0), sink), Failed)
    assert not any(isinstance(e, Refusal) for e in sink.events)
