"""The claims' DMs on Matrix, whose buttons are typed words: a real Synapse in front of the
simulated fleet. Each DM says the words (``matrix.render.claim_typed``); typed by the person the
button is for, they do what Slack's button does, audited with the source ``matrix``; typed by
someone else, they are refused, as the button is.

- *Claim* on a queue offer: ``!gpu take ID`` (the queue's own command);
- *Keep* / *Release* on an idle claim: ``!gpu keep claim ID`` / ``!gpu release NODE gpu N``;
- *Free it* of an intruder on a claimed GPU: ``!gpu free KEY``, which asks on-call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gpubot.core.claims.rules import ClaimState
from gpubot.matrix.render import APPROVAL_KEY
from tests.fixtures.matrix import (
    MatrixHarness,
    MatrixWorld,
    dm_invite,
    matrix_settings,
    running_matrix_bot,
)
from tests.fixtures.settings import ManualClock
from tests.fixtures.slack import workload_owner
from tests.fixtures.slack_flows import CLAIMS
from tests.procs import alive, until


@asynccontextmanager
async def claiming(
    world: MatrixWorld, fleet: Any, settings: Any, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[MatrixHarness]:
    """The bot on Synapse with claims on, on the test's clock (the test runs the duty)."""
    s = matrix_settings(world, dataclasses.replace(settings, claims=CLAIMS), workload_owner(fleet))
    async with running_matrix_bot(world, s, f"sqlite:///{tmp_path}/audit.db") as h:
        assert h.app.chat.claims is not None
        h.app.chat.claims.clock = clock
        yield h


def body(e: dict[str, Any]) -> str:
    content = e["content"]
    return str(content.get("m.new_content", content).get("body", ""))


async def answer(h: MatrixHarness, room: str, name: str, line: str, said: str) -> str:
    """``name`` types ``line`` in ``room``; return the bot's new answer there that says ``said``."""
    who = h.world.users[name]
    before = {e["event_id"] for e in await who.events(room)}
    await who.say(room, line)
    got = await who.wait_for(
        room, h.world.bot_id, lambda e: e["event_id"] not in before and said in body(e)
    )
    return body(got)


async def claim_records(h: MatrixHarness, change: str) -> list[tuple[str, str]]:
    """Who did ``change`` to a claim or a place in the queue, and through which front end."""
    return [
        (r.actor, r.source)
        for r in await h.store.records()
        if r.kind == "claim" and r.data["change"] == change
    ]


async def test_a_queue_offer_is_claimed_by_typing_its_word(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    clock = ManualClock()
    async with claiming(matrix_world, slack_fleet, slack_settings, tmp_path, clock) as h:
        w, alice, bob = h.world, h.world.users["alice"], h.world.users["bob"]
        await answer(h, w.room, "bob", "!gpu claim node1 gpu 2 for 1h", "claimed until")
        await answer(h, w.room, "alice", "!gpu wait node1 gpu 2", "in line for node1 GPU 2")
        await answer(h, w.room, "bob", "!gpu release node1 gpu 2", "released: node1 GPU 2")
        dm = await dm_invite(h, "alice")  # the first in line, at once
        await alice.join(dm)
        offer = await alice.wait_for(dm, w.bot_id, lambda e: "held for you" in body(e))
        found = re.search(
            r"Claim: !gpu take (\d+) · Leave the queue: !gpu leave (\d+)", body(offer)
        )
        assert found is not None and found[1] == found[2], body(offer)
        take = f"!gpu take {found[1]}"
        assert f"or type `{take}`" in body(offer) and "/gpu" not in body(offer)
        assert f"<code>{take}</code>" in offer["content"]["formatted_body"]

        # control: the word typed by someone else is refused, as the button is
        refused = await answer(h, w.room, "bob", take, "of yours in the queue")
        assert f"no place {found[1]} of yours in the queue" in refused
        assert await h.store.claims.active("node1") == []

        got = await answer(h, dm, "alice", take, "claimed until")
        assert "CUDA_VISIBLE_DEVICES=" in got
        (c,) = await h.store.claims.active("node1")
        assert (c.gpu, c.chat_id, c.note) == (
            2,
            alice.user_id,
            f"from the queue (place {found[1]})",
        )
        assert await claim_records(h, "taken") == [(alice.user_id, "matrix")]
        assert await claim_records(h, "released") == [(bob.user_id, "matrix")]
        assert (await h.store.verify()).ok


async def test_an_idle_claim_is_kept_then_released_by_typing_its_words(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    clock = ManualClock()
    async with claiming(matrix_world, slack_fleet, slack_settings, tmp_path, clock) as h:
        assert h.app.chat.claims is not None
        h.app.chat.claims.config = dataclasses.replace(CLAIMS, claim_idle_minutes=20, every_s=600)
        w, bob, tick = h.world, h.world.users["bob"], h.app.flows.claims.tick
        await answer(h, w.room, "bob", "!gpu claim node1 gpu 2 for 8h idle test", "claimed until")
        (c,) = await h.store.claims.active("node1")
        assert [await tick() for _ in range(2)] == [0, 0]  # the first look starts the run
        clock.advance(600)
        assert await tick() == 0
        clock.advance(600)
        assert await tick() == 1  # idle for 20 min: asked, in a DM
        dm = await dm_invite(h, "bob")
        await bob.join(dm)
        asked = await bob.wait_for(dm, w.bot_id, lambda e: "has been idle" in body(e))
        keep, release = f"!gpu keep claim {c.id}", "!gpu release node1 gpu 2"
        assert f"Keep: {keep} · Release: {release}" in body(asked)

        # controls: someone else's Keep and Release are refused; the claim stays bob's
        said = await answer(h, w.room, "dave", keep, "not an active claim")
        assert f"claim {c.id} is not an active claim of yours" in said
        await answer(h, w.room, "dave", release, "you have no claim there to release")
        assert [x.id for x in await h.store.claims.active("node1")] == [c.id]

        assert "kept: node1 GPU 2" in await answer(h, dm, "bob", keep, "kept:")
        assert await claim_records(h, "kept") == [(bob.user_id, "matrix")]
        assert "released: node1 GPU 2" in await answer(h, dm, "bob", release, "released:")
        ended = await h.store.claims.get(c.id)
        assert ended is not None and ended.state is ClaimState.RELEASED
        assert await claim_records(h, "released") == [(bob.user_id, "matrix")]


async def test_an_intruder_is_freed_by_typing_its_word_only_after_approval(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    clock = ManualClock()
    async with claiming(matrix_world, slack_fleet, slack_settings, tmp_path, clock) as h:
        w, bob = h.world, h.world.users["bob"]
        await answer(h, w.room, "bob", "!gpu claim node1 gpu 1 for 2h eval run", "claimed until")
        job = node1.spawn(gpu=1, mib=3000)  # the workload owner's, on bob's claimed GPU
        result = await h.app.sweep.run(alerting=True)
        (found,) = [f for f in result.findings if f.kind == "claim-intruder"]
        assert await h.app.flows.claims.tick() == 1
        dm = await dm_invite(h, "bob")
        await bob.join(dm)
        told = await bob.wait_for(dm, w.bot_id, lambda e: "uses your claimed GPU" in body(e))
        free = f"!gpu free {found.key.text()}"
        assert f"Free it: {free}" in body(told)

        refused = await answer(h, w.room, "dave", free, "only the person who claimed")
        assert "may ask to free it" in refused  # control: not dave's claim
        assert not [e for e in await bob.events(w.room) if APPROVAL_KEY in e["content"]]

        await bob.say(dm, free)
        request = await h.said(lambda e: APPROVAL_KEY in e["content"])
        assert "is claimed by" in body(request) and "eval run" in body(request)
        assert f"Unclaimed use: {job.user}'s pid {job.pid}" in body(request)
        assert alive(job.pid)  # nothing is killed without an approver
        approval = await h.store.approvals.get(request["content"][APPROVAL_KEY])
        assert approval is not None and (approval.requester, approval.source) == (
            bob.user_id,
            "matrix",
        )
        await w.users["carol"].say(w.room, f"!gpu approve {approval.id}")
        await until(lambda: not alive(job.pid), 20, "the approved kill")
        await h.bot.drain()
        (action,) = await h.store.actions()
        assert (action.actor, action.source) == (w.users["carol"].user_id, "matrix")
        assert "(Free it: claimed by bob;" in action.command
