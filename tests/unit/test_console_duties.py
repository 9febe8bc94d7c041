"""The console runs the root's duties as ``gpubot serve`` does: a request that nobody decides
expires. Each expires only its own: on ``serve``'s database, Slack's requests are Slack's to
update and tell their requesters of (two serving front ends: ``tests/integration/
test_two_fronts.py``). The memory store; the duties run on a virtual clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gpubot.app import App, Serving, build
from gpubot.chat.surface import MessageRef
from gpubot.cli.console import console_parts, identity
from gpubot.config import Settings, parse
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import NextLine, repl
from gpubot.core.models import ApprovalState
from tests.fixtures.approvals import REQUEST
from tests.fixtures.clock import VirtualClock

NODE = {"name": "node3", "host": "127.0.0.1", "port": 9}
SETTINGS: Settings = parse({"database": {"url": "memory://"}, "nodes": [NODE]}, "console.toml")
LOOKS = 50  # times the console looks, a virtual second apart, while it waits at its prompt


async def _ask(app: App, expires_in_s: float, source: str = "console") -> int:
    """Record alice's request made through ``source``, asked an hour ago; return its id."""
    assert app.store is not None
    asked = datetime.now(UTC) - timedelta(hours=1)
    a = await app.store.approvals.create(
        "console:alice", "alice", "node3", REQUEST, expires_in_s, source=source, now=asked
    )
    return a.id


def _waiting(
    app: App, clock: VirtualClock, ids: list[int], states: dict[int, ApprovalState]
) -> NextLine:
    """The console's prompt: it waits until the first request is no longer pending (or
    ``LOOKS`` virtual seconds), then notes each request's state and ends the input."""

    async def next_line() -> str | None:
        assert app.store is not None
        for _ in range(LOOKS):
            await clock.advance(1.0)
            first = await app.store.approvals.get(ids[0])
            if first is not None and first.state is not ApprovalState.PENDING:
                break
        for i in ids:
            a = await app.store.approvals.get(i)
            assert a is not None
            states[i] = a.state
        return None

    return next_line


async def test_the_console_expires_a_due_request() -> None:
    clock = VirtualClock()
    app = build(SETTINGS, {}, need_store=True, front=ConsoleFront(), clock=clock)
    due = await _ask(app, 60.0)  # ran out 59 minutes ago
    later = await _ask(app, 7200.0)  # the control: an hour left, it stays pending
    states: dict[int, ApprovalState] = {}
    who = identity(app.flows.svc.policy, None)
    assert await repl(console_parts(app), who, _waiting(app, clock, [due, later], states)) == 0
    assert states == {due: ApprovalState.EXPIRED, later: ApprovalState.PENDING}


async def test_the_console_leaves_another_front_ends_due_request_to_it() -> None:
    clock, printed = VirtualClock(), list[str]()
    app = build(SETTINGS, {}, need_store=True, front=ConsoleFront(echo=printed.append), clock=clock)
    mine = await _ask(app, 60.0)
    slacks = await _ask(app, 60.0, source="slack")  # due as well: serve's to expire and tell
    assert app.store is not None
    await app.store.approvals.set_message(slacks, MessageRef("C0OPS/1700000000.000100"))
    states: dict[int, ApprovalState] = {}
    who = identity(app.flows.svc.policy, None)
    assert await repl(console_parts(app), who, _waiting(app, clock, [mine, slacks], states)) == 0
    assert states == {mine: ApprovalState.EXPIRED, slacks: ApprovalState.PENDING}
    assert printed == []  # nor is Slack's message printed here
    await app.close()


async def test_a_serving_gpubot_expires_its_own_requests_only_too() -> None:
    serving = Serving(sweeps=False, settle_heap=False)
    app = build(SETTINGS, {}, need_store=True, front=ConsoleFront(echo=print), serving=serving)
    assert app.store is not None
    ids = [await _ask(app, 60.0), await _ask(app, 60.0, source="slack")]
    (duty,) = [s for s in app.schedulers if s.name == "approval-expiry"]
    await duty.job()
    after = [await app.store.approvals.get(i) for i in ids]
    expected = [ApprovalState.EXPIRED, ApprovalState.PENDING]  # its own (the control), not Slack's
    assert [a.state if a else None for a in after] == expected
    await app.close()


def test_every_front_end_runs_the_same_duties() -> None:
    from gpubot.slack.front import SlackAccess, SlackFront

    slack = SlackFront(SlackAccess("xoxb-not-a-token", "http://127.0.0.1:9/api/"))
    apps = [build(SETTINGS, {}, need_store=True, front=f) for f in (ConsoleFront(), slack)]
    names = [[s.name for s in a.schedulers] for a in apps]
    assert names == [["approval-expiry", "claims", "dm-due"]] * 2
    for a in apps:
        asyncio.run(a.close())
