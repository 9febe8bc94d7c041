"""Maintenance windows at the console on the simulated fleet (issue 37): on-call plans one,
others are refused (audited); a claim into it is refused (control: one that ends before it is
granted); a holder whose claim runs into it, and a person whose process runs on the node, are
DMed once, from ``notify_before`` ahead (control: not before)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, Serving, build
from gpubot.chat.flows import Flows
from gpubot.chat.message import Message
from gpubot.cli.console import identity
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer, render
from gpubot.core.claims.rules import ClaimSettings
from gpubot.core.timefmt import iso
from gpubot.store import open_store
from tests.fixtures.settings import ManualClock

CLAIMS = ClaimSettings(enabled=True, max_hours=8, hold_minutes=10)
H = 3600.0


@pytest.fixture
async def app(slack_settings: Any, tmp_path: Path) -> AsyncIterator[App]:
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    s = dataclasses.replace(slack_settings, database_url=url, claims=CLAIMS)
    built = build(s, {}, need_store=True, front=ConsoleFront(), serving=Serving(sweeps=False))
    yield built
    await built.close()


async def test_a_window_refuses_claims_into_it_and_tells_holders_once(app: App, node1: Any) -> None:
    flows: Flows = app.flows
    clock = ManualClock()
    assert app.chat.claims is not None and app.chat.maint is not None
    app.chat.claims.clock = clock
    app.chat.maint.clock = clock
    flows.clock = clock
    told: list[tuple[str, str, str]] = []

    async def dm(user: str, msg: Message, subject: str) -> bool:
        told.append((user, render(msg), subject))
        return True

    flows.claims.dm = dm
    policy = flows.svc.policy
    bob, carol, dave = (identity(policy, u) for u in ("U0BOB", "U0CAROL", "U0DAVE"))
    # bob holds a GPU for 6 h before the window is planned: it runs into it
    assert "claimed until" in await answer(flows, "claim node1 gpu 0 for 6h", bob)
    refused = await answer(flows, "maint node1 from now for 1h because nope", dave)
    assert "only on-call" in refused
    planned = await answer(flows, "maint node1 in 3h", carol)
    assert "bad" in planned or "usage" in planned  # bad input: one line
    at = iso(clock.now() + 3 * H).removesuffix("Z")[:16]  # e.g. 2026-12-12T02:00
    planned = await answer(flows, f"maint node1 from {at} for 4h because kernel update", carol)
    assert "planned #" in planned and "kernel update, by U0CAROL" in planned
    assert "kernel update" in await answer(flows, "maint", dave)
    shown = await answer(flows, "status node1", dave)  # the node's answer names its window
    assert "maintenance" in shown and "kernel update, by U0CAROL" in shown, shown
    # a claim into the window is refused, with how long would fit
    into = await answer(flows, "claim node1 gpu 1 for 4h", dave)
    assert "not claimed: node1 is down for maintenance" in into and "at most" in into
    # the control: a claim that ends before it is granted
    assert "claimed until" in await answer(flows, "claim node1 gpu 1 for 2h", dave)
    assert "not extended" in await answer(flows, "extend node1 gpu 1 by 2h", dave)
    # U0OWNER's job runs on node1 (no claim): told too, once, naming the process
    job = node1.spawn(gpu=2, mib=700)
    # notify_before is 1h: not told 2h ahead (the control), told once from 1h ahead
    clock.advance(1 * H)
    await flows.claims.tick()
    assert [t for t in told if t[2].startswith("dm:maint")] == []
    clock.advance(1 * H + 60)
    await flows.claims.tick()
    await flows.claims.tick()
    ahead = sorted(t for t in told if t[2].startswith("dm:maint"))
    assert [t[0] for t in ahead] == ["U0BOB", "U0OWNER"]
    assert "node1 is down for maintenance" in ahead[0][1] and "GPU 0" in ahead[0][1]
    assert f"Your processes run there (GPU 2 pid {job.pid})" in ahead[1][1]
    records = await app.store.records()  # type: ignore[union-attr]
    maint = [r.payload for r in records if r.kind == "maint"]
    assert len(maint) == 2 and '"refused"' in maint[0] and '"opened"' in maint[1]
