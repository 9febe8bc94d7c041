"""Sweep alerts and idle-holder DMs on Matrix: a real Synapse in front of the simulated fleet.

The bot is the real composition (``gpubot.app.build`` on ``MatrixFront``) with its long poll
running; the sweep service gets the test's clock, so an hour of sweeps takes seconds. The
workloads are real processes at 0 % or holding leaked memory; people are real Matrix clients.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gpubot.chat.heads import HeadPublisher
from gpubot.chat.message import Message
from gpubot.core.findings import IDLE_HOLDER
from gpubot.core.usage.ladder import LadderRule
from gpubot.core.usage.report import Digest
from gpubot.lifecycle import Serving
from gpubot.matrix.poster import MatrixPoster
from tests.fixtures.fleet import leave_clean
from tests.fixtures.matrix import (
    MatrixHarness,
    MatrixWorld,
    dm_invite,
    matrix_settings,
    running_matrix_bot,
)
from tests.fixtures.settings import ManualClock, with_sweep
from tests.fixtures.slack import workload_owner
from tests.procs import wait_dead

INTERVAL = 900  # a sweep every 15 minutes of the test's clock
SWEEP = {"interval_s": INTERVAL, "idle_hours": 1, "idle_min_mib": 4096, "keep_samples": "1d"}


@asynccontextmanager
async def sweeping(
    world: MatrixWorld,
    fleet: Any,
    settings: Any,
    tmp_path: Path,
    clock: ManualClock,
    ladder: LadderRule | None = None,
) -> AsyncIterator[MatrixHarness]:
    """The bot on Synapse with sweeps on the test's clock (no schedule: the test sweeps)."""
    s = matrix_settings(world, settings, workload_owner(fleet))
    assert s.sweep.channel == world.room  # alerts go to the first room (``on_matrix``)
    cfg = dataclasses.replace(with_sweep(settings, **SWEEP).sweep, channel=s.sweep.channel)
    s = dataclasses.replace(s, sweep=cfg, ladder=ladder or s.ladder)
    async with running_matrix_bot(world, s, f"sqlite:///{tmp_path}/audit.db") as h:
        svc = h.app.sweep
        assert svc.keeper is not None and svc.idle is not None and svc.ladder is not None
        svc.clock = svc.keeper.clock = svc.idle.clock = svc.ladder.clock = clock
        assert h.app.chat.usage is not None
        h.app.chat.usage.clock = clock
        yield h


def outbox_rows(h: MatrixHarness, subject: str) -> list[tuple[str, str, str]]:
    """The outbox's rows of ``subject``: token, state, where the post landed."""
    from sqlalchemy import select

    from gpubot.store.tables import outbox

    c = outbox.c
    with h.store.engine.connect() as conn:
        rows = conn.execute(select(c.token, c.state, c.ref).where(c.subject == subject)).all()
    return [(r.token, r.state, r.ref) for r in rows]


def from_bot(h: MatrixHarness, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bot's new messages (not edits) among ``events``."""
    return [
        e
        for e in events
        if e["sender"] == h.world.bot_id
        and e["type"] == "m.room.message"
        and e["content"].get("m.relates_to", {}).get("rel_type") != "m.replace"
    ]


async def test_an_idle_holder_gets_one_dm_and_frees_it_by_command(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    hoarder = node1.spawn(gpu=0, mib=8192, util_pct=0)
    node1.spawn(gpu=1, mib=8192, util_pct=80)  # busy the whole time: never told
    start = time.time() - 6 * INTERVAL
    clock = ManualClock(start)
    async with sweeping(matrix_world, slack_fleet, slack_settings, tmp_path, clock) as h:
        w, alice = h.world, h.world.users["alice"]
        for i in range(5):  # an hour of samples at 0 %: found at the fifth, seen once
            clock.t = start + i * INTERVAL
            assert (await h.app.sweep.run()).alerted == ()
        clock.t = start + 5 * INTERVAL
        alerted = await h.app.sweep.run()
        (key,) = alerted.alerted
        assert key.kind == IDLE_HOLDER and key.gpu == 0
        (alert,) = from_bot(h, await alice.events(w.room))
        assert "idle GPU holder" in alert["content"]["body"]

        dm = await dm_invite(h, "alice")
        await alice.join(dm)
        (msg,) = from_bot(h, await alice.events(dm))
        body, html = msg["content"]["body"], msg["content"]["formatted_body"]
        assert msg["content"]["msgtype"] == "m.notice"
        assert "Your job holds node1 GPU 0 idle (1 h 15 min at 0 %)" in body
        assert f"pid {hoarder.pid}" in body and "holds 8192 MiB of GPU 0" in body
        assert f"Free it: !gpu free {key.text()}" in body
        assert f"Snooze 1 day: !gpu snooze 1d {key.text()}" in body
        link = f"https://matrix.to/#/{quote(w.room)}/{quote(alert['event_id'])}"
        assert f'<a href="{link}">the alert</a>' in html  # where the alert is
        # Posted once through the outbox: its token is the transaction id the bot's device sees.
        seen = (await h.bot.api.event(dm, msg["event_id"]))["unsigned"]["transaction_id"]
        subject = f"dm:idle:node1:0:{key.holder}:{alice.user_id}"
        assert outbox_rows(h, subject) == [(seen, "posted", f"{dm}/{msg['event_id']}")]
        # A resend with that token (a retry after a lost answer or a crash) is the same event.
        again = await MatrixPoster(h.bot.api).post(dm, Message("again"), token=seen)
        assert again.ref == f"{dm}/{msg['event_id']}"
        assert len(from_bot(h, await alice.events(dm))) == 1

        clock.t = start + 6 * INTERVAL  # the holder persists: no second DM, no second alert
        assert (await h.app.sweep.run()).alerted == ()
        assert len(from_bot(h, await alice.events(dm))) == 1
        assert len(from_bot(h, await alice.events(w.room))) == 1

        # "Free it", typed in the DM: the owner's own reset of that pid
        await alice.say(dm, f"!gpu free {key.text()}")
        await alice.wait_for(dm, w.bot_id, lambda e: "freed" in _shown(e).get("body", ""))
        wait_dead(hoarder.pid)
        await h.bot.drain()
        (action,) = await h.store.actions()
        assert (action.actor, action.status) == (alice.user_id, "freed")
        assert action.command == f"/gpu reset node1 gpu 0 pid {hoarder.pid} (Free it)"


def _shown(e: dict[str, Any]) -> dict[str, Any]:
    content: dict[str, Any] = e["content"]
    return content.get("m.new_content", content)  # type: ignore[no-any-return]


@pytest.mark.usefixtures("node1")
async def test_an_orphan_alert_is_posted_once_snoozed_by_command_and_edited_resolved(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, tmp_path: Path
) -> None:
    n1 = slack_fleet.node("node1")
    w = n1.spawn(gpu=3, mib=4096, behaviour="orphan")
    os.kill(w.pid, 9)  # the process this test started: its memory stays, leaked
    wait_dead(w.pid)
    clock = ManualClock(time.time())
    async with sweeping(matrix_world, slack_fleet, slack_settings, tmp_path, clock) as h:
        world, carol = h.world, h.world.users["carol"]
        assert (await h.app.sweep.run()).alerted == ()  # seen once
        clock.t += INTERVAL
        (key,) = (await h.app.sweep.run()).alerted
        (alert,) = from_bot(h, await carol.events(world.room))
        body = alert["content"]["body"]
        assert "⚠ GPU 3: orphaned GPU memory" in body
        assert "Reset GPU 3: !gpu reset node1 gpu 3" in body
        assert f"!gpu snooze 1h {key.text()}" in body
        seen = (await h.bot.api.event(world.room, alert["event_id"]))["unsigned"]["transaction_id"]
        where = f"{world.room}/{alert['event_id']}"
        assert outbox_rows(h, "alert:node1") == [(seen, "posted", where)]  # the outbox's token

        def edit_of_alert(test: str) -> Any:
            return lambda e: (
                e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"
                and e["content"]["m.relates_to"]["event_id"] == alert["event_id"]
                and test in e["content"]["m.new_content"]["body"]
            )

        # "Snooze 1 h", typed: the alert is edited, and the audit names who snoozed it
        await carol.say(world.room, f"!gpu snooze 1h {key.text()}")
        await h.said(edit_of_alert("snoozed until"))
        await h.said(lambda e: "snoozed until" in e["content"].get("body", "") and _new(e))
        records = [r for r in await h.store.records() if r.kind == "alert"]
        assert [(r.data["alert"], r.actor) for r in records] == [
            ("alerted", "gpubot"),
            ("snoozed", f"matrix:{carol.user_id}"),
        ]

        clock.t += 3600 + INTERVAL  # the snooze has ended: a reminder, in the alert's thread
        assert (await h.app.sweep.run()).reminded == (key,)
        reminder = await h.said(
            lambda e: (
                e["content"].get("m.relates_to", {}).get("rel_type") == "m.thread"
                and e["content"]["m.relates_to"]["event_id"] == alert["event_id"]
            )
        )
        assert "GPU 3" in _body(reminder)

        leave_clean(n1)  # the leaked memory goes, as a GPU reset would drop it
        clock.t += INTERVAL
        assert (await h.app.sweep.run()).resolved == ()  # an alerted finding clears in two
        clock.t += INTERVAL
        assert (await h.app.sweep.run()).resolved == (key,)
        await h.said(edit_of_alert("resolved"))
        # the alert, the snooze's answer, the reminder (in the thread): no second alert
        assert len(from_bot(h, await carol.events(world.room))) == 3


def _new(e: dict[str, Any]) -> bool:
    return bool(e["content"].get("m.relates_to", {}).get("rel_type") != "m.replace")


LADDER = LadderRule(True, remind_after_s=1800, post_after_s=1800, offer_after_s=900)


async def test_the_reclaim_ladder_dms_the_owner_who_keeps_one_gpu_by_command(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    climbs = node1.spawn(gpu=0, mib=8192, util_pct=0)
    kept = node1.spawn(gpu=2, mib=8192, util_pct=0)  # the owner keeps this one
    start = time.time() - 3 * 3600
    clock = ManualClock(start)
    async with sweeping(matrix_world, slack_fleet, slack_settings, tmp_path, clock, LADDER) as h:
        w, alice, bob = h.world, h.world.users["alice"], h.world.users["bob"]

        async def sweep_at(minutes: int) -> set[str]:
            clock.t = start + minutes * 60
            result = await h.app.sweep.run()
            assert result.failed == {}
            return {f.key.text() for f in result.findings if f.kind is IDLE_HOLDER}

        for m in (0, 15, 30, 45):
            assert await sweep_at(m) == set()
        idle = await sweep_at(60)  # an hour at 0 %: step 1, a DM each, no room alert
        a = next(k for k in idle if f'"{climbs.pid}:' in k)
        b = next(k for k in idle if f'"{kept.pid}:' in k)
        dm = await dm_invite(h, "alice")
        await alice.join(dm)
        dms = from_bot(h, await alice.events(dm))
        assert len(dms) == 2 and from_bot(h, await alice.events(w.room)) == []
        said = "\n".join(e["content"]["body"] for e in dms)
        assert f"Free it: !gpu free {a}" in said and f"!gpu keep {b} because REASON" in said
        for e in dms:  # each once through the outbox, its token the transaction id
            seen = (await h.bot.api.event(dm, e["event_id"]))["unsigned"]["transaction_id"]
            (row,) = [r for r in outbox_rows_under(h, "dm:ladder:") if r[0] == seen]
            assert row[1:] == ("posted", f"{dm}/{e['event_id']}")

        # Keep, typed: bob (not the holder) is refused in the room; alice keeps it in the DM
        await bob.say(w.room, f"!gpu keep {b} because not mine")
        await h.said(lambda e: _new(e) and "can keep this GPU" in _body(e))
        await alice.say(dm, f"!gpu keep {b} because eval run resumes at 18:00")
        await alice.wait_for(dm, w.bot_id, lambda e: "kept" in _body(e))
        assert h.app.sweep.ladder is not None
        rungs = await h.app.sweep.ladder.store.rungs()
        assert rungs[b].kept and rungs[b].kept_reason == "eval run resumes at 18:00"
        assert not rungs[a].kept

        await sweep_at(75)
        await sweep_at(90)  # step 2 for the one not kept only
        reminders = [e for e in from_bot(h, await alice.events(dm)) if "Reminder" in _body(e)]
        assert len(reminders) == 1 and "node1 GPU 0" in _body(reminders[0])
        await sweep_at(105)
        await sweep_at(120)  # step 3: the alerts room names the holder, with a pill
        (named,) = [e for e in from_bot(h, await alice.events(w.room)) if "held idle" in _body(e)]
        assert f"node1 GPU 0 held idle by {climbs.user}" in _body(named)
        assert f'href="https://matrix.to/#/{alice.user_id}"' in named["content"]["formatted_body"]


def _body(e: dict[str, Any]) -> str:
    return str(e["content"].get("body", ""))


def outbox_rows_under(h: MatrixHarness, prefix: str) -> list[tuple[str, str, str]]:
    from sqlalchemy import select

    from gpubot.store.tables import outbox

    c = outbox.c
    with h.store.engine.connect() as conn:
        rows = conn.execute(select(c.token, c.state, c.ref).where(c.subject.startswith(prefix)))
    return [(r.token, r.state, r.ref) for r in rows]


async def test_the_weekly_digest_and_the_audit_head_are_posted_in_the_alerts_room(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    node1.spawn(gpu=0, mib=4096, util_pct=90)
    monday = Digest.parse("mon 09:00").last_due(time.time())
    # [reports] digest_channel names a Slack channel: on Matrix the digest goes to the alerts room
    reports = dataclasses.replace(
        slack_settings.reports, digest=Digest.parse("mon 09:00"), digest_channel="C0DIGEST"
    )
    audit = dataclasses.replace(slack_settings.audit, publish_head_every_s=86400.0)
    base = dataclasses.replace(slack_settings, reports=reports, audit=audit)
    s = matrix_settings(matrix_world, with_sweep(base, **SWEEP), workload_owner(slack_fleet))
    url, serving = f"sqlite:///{tmp_path}/audit.db", Serving(sweeps=False, settle_heap=False)
    async with running_matrix_bot(matrix_world, s, url, serving) as h:
        svc, clock = h.app.sweep, ManualClock(monday - 2 * INTERVAL)
        assert svc.keeper is not None and svc.idle is not None and svc.digest is not None
        assert h.app.chat.usage is not None and svc.ladder is not None
        svc.clock = svc.keeper.clock = svc.idle.clock = svc.ladder.clock = clock
        svc.digest.clock = h.app.chat.usage.clock = clock
        for t in (monday - 2 * INTERVAL, monday - INTERVAL, monday + 300):
            clock.t = t  # two sweeps of samples, then the one after Monday 09:00 posts it
            await svc.run()
        w, alice = h.world, h.world.users["alice"]
        (digest,) = [e for e in from_bot(h, await alice.events(w.room)) if "Weekly" in _body(e)]
        assert "Weekly GPU-hours by team" in _body(digest) and "<table>" in _html(digest)
        day = time.strftime("%Y-%m-%d", time.gmtime(monday))
        ((_, state, ref),) = outbox_rows(h, f"digest:{day}")
        assert (state, ref) == ("posted", f"{w.room}/{digest['event_id']}")

        heads = h.app.heads
        assert isinstance(heads, HeadPublisher) and heads.channel == w.room
        result = await heads.publish()
        assert result is not None and result.ok
        said = [e for e in from_bot(h, await alice.events(w.room)) if "Audit log head" in _body(e)]
        (head,) = said
        assert f"gpubot audit verify --expect-head {result.head}" in _body(head)
        ((_, state, ref),) = outbox_rows(h, "audit-head")
        assert (state, ref) == ("posted", f"{w.room}/{head['event_id']}")


def _html(e: dict[str, Any]) -> str:
    return str(e["content"].get("formatted_body", ""))
