"""Claims and the queue through signed Slack requests (issue 26): claim, conflict with its
*Queue me* button, queue, extend, release, the free-GPU DM to the first waiter, the next one
after the hold runs out, one click to claim, and expiry, on a clock the test moves."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from typing import Any

from gpubot.chat import claim_view as view
from gpubot.chat.reset_view import ACTION_APPROVE
from gpubot.core.claims.rules import ClaimSettings
from gpusim.node_layout import gpu_uuid
from tests.fixtures.settings import ManualClock
from tests.fixtures.slack import (
    Call,
    DmSlack,
    FakeSlack,
    Harness,
)
from tests.fixtures.slack_flows import CLAIMS, ask, said, serving
from tests.procs import alive, until


def dms(fake: FakeSlack, user: str, since: int = 0) -> list[Call]:
    return [
        c
        for c in fake.calls[since:]
        if c.method == "chat.postMessage" and c.body.get("channel") == f"D{user[1:]}"
    ]


def button(call: Call, action_id: str) -> str:
    blocks = call.body.get("blocks") or []
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    for b in blocks:
        for e in b.get("elements", []) + ([b["accessory"]] if "accessory" in b else []):
            if e.get("action_id") == action_id:
                return str(e["value"])
    raise AssertionError(f"no {action_id} button in {call.body}")


async def click(h: Harness, action: str, value: str, user: str) -> str:
    n = len(h.fake.calls)
    reply = await h.send.click(action, value, user=user, channel="C0GENERAL")
    assert reply.status == 200
    await h.settle()
    return said(h.fake, n)


async def test_claim_conflict_queue_extend_release_hold_and_expiry(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    clock = ManualClock()
    uuids = {i: gpu_uuid("node1", i) for i in range(4)}
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/a.db", clock) as (h, _):
        got = await ask(h, "claim node1 gpu 2,3 for 4h train llama", "U0BOB")
        assert f"CUDA_VISIBLE_DEVICES={uuids[2]},{uuids[3]}" in got and "train llama" in got
        refused = await ask(h, "claim node1 gpu 3 for 1h", "U0DAVE")
        assert "Not claimed" in refused and "claimed by <@U0BOB>" in refused
        assert "train llama" in refused and "<!date^" in refused  # until when, in their zone
        conflict = [c for c in dm_slack.calls if c.method.startswith("response:")][-1]
        join = button(conflict, view.ACTION_JOIN)
        assert join == "wait node1 gpu 3 for 1h"
        assert "in line for node1 GPU 3" in await click(h, view.ACTION_JOIN, join, "U0DAVE")
        assert "1 ahead" in await ask(h, "wait node1 gpu 3", "U0OWNER")
        queue = await ask(h, "queue node1", "U0BOB")
        assert queue.index("<@U0DAVE>") < queue.index("<@U0OWNER>")
        assert "now until" in await ask(h, "extend node1 gpu 2 by 2h", "U0BOB")
        too_long = await ask(h, "claim node1 gpu 0 for 9h", "U0BOB")
        assert "lasts at most 8h" in too_long

        n = len(dm_slack.calls)
        assert "released: node1 GPU 3" in await ask(h, "release node1 gpu 3", "U0BOB")
        (offer,) = dms(dm_slack, "U0DAVE", n)  # the first in line, at once
        assert "is free and held for you" in json.dumps(offer.body) and not dms(
            dm_slack, "U0OWNER", n
        )
        took = await ask(h, "claim node1 gpu 3 for 1h", "U0CAROL")
        assert "held for <@U0DAVE>" in took  # the hold keeps it for dave

        clock.advance(16 * 60)  # dave lets the hold run out: the next in line is told
        n = len(dm_slack.calls)
        assert await h.bot.flows.claims.tick() == 2
        assert "ran out" in json.dumps(dms(dm_slack, "U0DAVE", n)[0].body)
        (second,) = dms(dm_slack, "U0OWNER", n)
        wait_id = button(second, view.ACTION_TAKE)
        mine = await click(h, view.ACTION_TAKE, wait_id, "U0OWNER")
        assert f"CUDA_VISIBLE_DEVICES={uuids[3]}" in mine
        assert await h.bot.flows.claims.tick() == 0  # nothing more to tell

        table = await ask(h, "claims all", "U0DAVE")
        assert "train llama" in table and "from the queue" in table and "<@U0BOB>" in table
        clock.advance(8 * 3600)  # every claim runs out
        n = len(dm_slack.calls)
        assert await h.bot.flows.claims.tick() == 2
        assert "ended" in json.dumps(dms(dm_slack, "U0BOB", n)[0].body)
        assert "No active claims" in await ask(h, "claims all", "U0BOB")
        assert h.store is not None
        changes = [r.data["change"] for r in await h.store.records() if r.kind == "claim"]
        assert changes.count("claimed") == 3 and changes.count("expired") == 2
        assert {"queued", "offered", "lapsed", "taken", "released", "extended"} <= set(changes)
        assert (await h.store.verify()).ok


async def test_bad_input_is_one_line_and_claims_off_still_waits(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any
) -> None:
    clock = ManualClock()
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/b.db", clock) as (h, app):
        bad = await ask(h, "claim node1 gpu 2 for 4x", "U0BOB")
        assert "bad duration '4x'" in bad and "Traceback" not in bad
        assert "no GPU 9" in await ask(h, "claim node1 gpu 9 for 1h", "U0BOB")
        assert "unknown node 'nodeX'" in await ask(h, "claim nodeX gpu 1 for 1h", "U0BOB")
        assert app.chat.claims is not None
        app.chat.claims.config = ClaimSettings()  # claims off: wait still tells
        assert "not enabled" in await ask(h, "claim node1 gpu 1 for 1h", "U0BOB")
        await ask(h, "wait node1 gpu 1", "U0BOB")
        assert await h.bot.flows.claims.tick() == 0  # free once: not yet
        assert await h.bot.flows.claims.tick() == 1  # free on two looks in a row
        (told,) = dms(dm_slack, "U0BOB")
        assert "is free now" in json.dumps(told.body)
        assert "No one is waiting" in await ask(h, "queue", "U0BOB")


async def test_an_intruder_is_found_by_a_sweep_and_freed_only_after_approval(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    clock = ManualClock()
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/c.db", clock) as (h, app):
        assert "claimed until" in await ask(h, "claim node1 gpu 1 for 2h eval run", "U0BOB")
        w = node1.spawn(gpu=1, mib=3000)  # the workload owner's job, on bob's claimed GPU
        mine = node1.spawn(gpu=0, mib=1000)  # on an unclaimed GPU: no intruder
        result = await app.sweep.run(alerting=True)
        (found,) = [f for f in result.findings if f.kind.value == "claim-intruder"]
        assert (found.node, found.gpu, found.pid) == ("node1", 1, w.pid)
        assert f"pid {w.pid}" in found.summary and "it started " in found.summary
        assert "claimed by bob" in found.summary
        n = len(dm_slack.calls)
        assert await h.bot.flows.claims.tick() == 1
        assert await h.bot.flows.claims.tick() == 0  # the claimant is told once
        (dm,) = dms(dm_slack, "U0BOB", n)
        key = button(dm, view.ACTION_FREE_INTRUDER)
        refused = await click(h, view.ACTION_FREE_INTRUDER, key, "U0DAVE")
        assert "only the person who claimed" in refused
        await click(h, view.ACTION_FREE_INTRUDER, key, "U0BOB")
        (request,) = [c for c in dm_slack.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        text = json.dumps(request.body, ensure_ascii=False)
        assert "is claimed by <@U0BOB> (bob) since" in text and "eval run" in text
        assert f"Unclaimed use: {w.user}'s pid {w.pid}" in text and ", started " in text
        assert alive(w.pid)  # nothing is killed without an approver
        approval_id = button(request, ACTION_APPROVE)
        await h.send.click(ACTION_APPROVE, approval_id, user="U0CAROL")
        await h.settle()
        await until(lambda: not alive(w.pid), 20, "the approved kill")
        assert alive(mine.pid)  # only the intruder


async def test_a_gpu_running_another_users_job_cannot_be_claimed(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    """Claiming a GPU someone's job already runs on would make that job an "intruder" at once,
    its *Free it* a forced kill of work that was there first: refused; one's own job is not."""
    clock = ManualClock()
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/f.db", clock) as (h, _app):
        w = node1.spawn(gpu=1, mib=3000)  # the workload owner's job
        refused = await ask(h, "claim node1 gpu 1 for 2h", "U0BOB")
        assert f"node1 GPU 1 runs {w.user}'s job (pid {w.pid})" in refused
        assert "wait node1 gpu 1" in refused
        assert "claimed until" in await ask(h, "claim node1 gpu 2 for 2h", "U0BOB")  # control
        assert "claimed until" in await ask(h, "claim node1 gpu 1 for 2h", "U0OWNER")  # own job
        assert alive(w.pid)


async def test_free_it_of_a_claim_that_ended_asks_no_one(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    """The DM's *Free it* outlives the claim: once released, it must not ask on-call to kill
    a process "on a claimed GPU" (the test above is the control: the claim still active)."""
    clock = ManualClock()
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/e.db", clock) as (h, app):
        assert "claimed until" in await ask(h, "claim node1 gpu 1 for 2h eval run", "U0BOB")
        w = node1.spawn(gpu=1, mib=3000)
        await app.sweep.run(alerting=True)
        n = len(dm_slack.calls)
        assert await h.bot.flows.claims.tick() == 1
        (dm,) = dms(dm_slack, "U0BOB", n)
        key = button(dm, view.ACTION_FREE_INTRUDER)
        assert "released" in await ask(h, "release node1", "U0BOB")
        said_now = await click(h, view.ACTION_FREE_INTRUDER, key, "U0BOB")
        assert "your claim of node1 GPU 1 has ended" in said_now
        assert not [c for c in dm_slack.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        assert alive(w.pid)


async def test_an_idle_claim_is_asked_then_kept_then_released(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    clock = ManualClock()
    async with serving(slack_settings, dm_slack, f"sqlite:///{tmp_path}/d.db", clock) as (h, app):
        assert app.chat.claims is not None
        app.chat.claims.config = dataclasses.replace(CLAIMS, claim_idle_minutes=20, every_s=600)
        tick = h.bot.flows.claims.tick
        await ask(h, "claim node1 gpu 2 for 8h idle test", "U0BOB")
        busy = node1.spawn(gpu=3, mib=2000, util_pct=80)  # a busy GPU is never idle
        await ask(h, "claim node1 gpu 3 for 8h busy", "U0OWNER")
        assert await tick() == 0  # the first look starts the run
        clock.advance(600)
        assert await tick() == 0  # idle for 10 min
        clock.advance(600)
        n = len(dm_slack.calls)
        assert await tick() == 1  # idle for 20 min: asked
        (asked,) = dms(dm_slack, "U0BOB", n)
        assert "has been idle (0 %) for 20m" in json.dumps(asked.body, ensure_ascii=False)
        assert not dms(dm_slack, "U0OWNER", n)
        claim_id = button(asked, view.ACTION_KEEP)
        assert "is not an active claim of yours" in await click(
            h, view.ACTION_KEEP, claim_id, "U0DAVE"
        )
        assert "kept: node1 GPU 2" in await click(h, view.ACTION_KEEP, claim_id, "U0BOB")
        for _ in range(2):  # the run starts anew at the next look
            clock.advance(600)
            assert await tick() == 0
        clock.advance(600)
        n = len(dm_slack.calls)
        assert await tick() == 1  # asked again; this time no one keeps it
        release = button(dms(dm_slack, "U0BOB", n)[-1], view.ACTION_RELEASE)
        assert release == f"{claim_id} node1 2"  # the id, and what Matrix's words name
        for value in (release, claim_id):  # a DM posted before the value named the GPU, too
            refused = await click(h, view.ACTION_RELEASE, value, "U0DAVE")
            assert f"claim {claim_id} is not an active claim of yours" in refused
        clock.advance(600)
        assert await tick() == 0
        clock.advance(600)
        assert await tick() == 1  # still idle as long again: released
        assert "was released: it stayed idle" in json.dumps(dms(dm_slack, "U0BOB", n)[-1].body)
        left = await ask(h, "claims all", "U0BOB")
        assert "busy" in left and "idle test" not in left
        assert busy.alive()
        assert h.store is not None
        changes = [r.data["change"] for r in await h.store.records() if r.kind == "claim"]
        assert changes.count("idle-asked") == 2 and changes.count("kept") == 1
        assert changes[-1] == "released-idle"


async def test_an_intruders_free_it_is_looked_up_when_clicked_after_a_restart(
    slack_settings: Any, slack_fleet: Any, dm_slack: DmSlack, tmp_path: Any, node1: Any
) -> None:
    """The claimant's *Free it* names a process the sweep of another run found: a bot restarted
    since (or another front end's process, which does not sweep) looks for it on the node when
    clicked, and asks the approvers as the first would; once it is gone, it says so."""
    clock, url = ManualClock(), f"sqlite:///{tmp_path}/r.db"
    async with serving(slack_settings, dm_slack, url, clock) as (h, app):
        assert "claimed until" in await ask(h, "claim node1 gpu 1 for 2h eval run", "U0BOB")
        w = node1.spawn(gpu=1, mib=3000)
        await app.sweep.run(alerting=True)
        n = len(dm_slack.calls)
        assert await h.bot.flows.claims.tick() == 1
        key = button(dms(dm_slack, "U0BOB", n)[0], view.ACTION_FREE_INTRUDER)
    async with serving(slack_settings, dm_slack, url, clock) as (h, app):  # never swept
        execs = slack_fleet.execs().get("node1", 0)
        dave = await click(h, view.ACTION_FREE_INTRUDER, key, "U0DAVE")  # not the claimant
        assert "you hold no claim of node1 GPU 1: only its claimant may ask to free it" in dave
        assert slack_fleet.execs().get("node1", 0) == execs  # asking probed nothing
        await click(h, view.ACTION_FREE_INTRUDER, key, "U0BOB")
        assert slack_fleet.execs()["node1"] > execs  # the claimant's: looked up on the node
        (request,) = [c for c in dm_slack.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
        assert f"Unclaimed use: {w.user}'s pid {w.pid}" in json.dumps(request.body)
        assert alive(w.pid)  # asked, not killed
        os.kill(w.pid, signal.SIGKILL)  # the test's own workload ends
        await until(lambda: not alive(w.pid), 20, "the workload's end")
        gone = await click(h, view.ACTION_FREE_INTRUDER, key, "U0BOB")  # the control
        assert "that process is no longer seen on the claimed GPU" in gone
