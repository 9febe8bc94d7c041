"""gpubot on Matrix: who and where it answers. An encrypted room is refused in one line (never
silence), a user of another homeserver is refused in one line, an approver denies by typing, and
old commands are never replayed after a restart."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpubot.chat.message import note
from gpubot.core.models import ApprovalState
from gpubot.matrix.bot import ENCRYPTED
from gpubot.matrix.render import APPROVAL_KEY, to_matrix
from tests.fixtures.matrix import MatrixHarness, MatrixWorld, matrix_settings, running_matrix_bot
from tests.fixtures.slack import workload_owner
from tests.procs import alive

MEGOLM = {  # what Element sends in an encrypted room (the ciphertext is opaque to the server)
    "algorithm": "m.megolm.v1.aes-sha2",
    "ciphertext": "AwgAEnACgAkLmt6qF84IK++J7UDH2Za1YVchHyprqTqsg",
    "device_id": "ELEMENT",
    "sender_key": "IlRMeOPX2e0MurIyfWEucYBRVOEEUMrOHqn/8mLqMjA",
    "session_id": "X3lUlvLELLYxeTx4yOVu6UDpasGEVO0Jbu+QFnm0cKQ",
}


def notice(e: dict[str, Any]) -> bool:
    content = e["content"]
    edit = content.get("m.relates_to", {}).get("rel_type") == "m.replace"
    return e["type"] == "m.room.message" and content.get("msgtype") == "m.notice" and not edit


async def test_an_encrypted_dm_is_refused_in_one_line_in_the_room_and_the_log(
    matrix: MatrixHarness, caplog: pytest.LogCaptureFixture
) -> None:
    world = matrix.world
    alice = world.users["alice"]
    encryption = {"type": "m.room.encryption", "state_key": "", "content": MEGOLM_STATE}
    room = await alice.create_room(
        invite=(world.bot_id,), is_direct=True, initial_state=[encryption]
    )
    caplog.set_level(logging.WARNING, logger="gpubot.matrix")
    refusal = await alice.wait_for(room, world.bot_id, notice)  # joined, then said so
    assert refusal["content"]["body"] == ENCRYPTED and "\n" not in ENCRYPTED
    await alice.send(room, MEGOLM, "m.room.encrypted")  # "!gpu status", encrypted
    await matrix.bot.drain()
    said = [e for e in await alice.from_user(room, world.bot_id) if notice(e)]
    assert [e["content"]["body"] for e in said] == [ENCRYPTED]  # once per room, not per event
    assert any(room in r.getMessage() and "encrypted" in r.getMessage() for r in caplog.records)


MEGOLM_STATE = {"algorithm": "m.megolm.v1.aes-sha2"}


async def test_a_user_of_another_homeserver_is_refused_in_one_line(
    matrix: MatrixHarness,
) -> None:
    """No second homeserver federates here: the event of @mallory:evil.example is handed to the
    bot as its sync would hand it; the refusal goes through the flows to the real room."""
    world = matrix.world
    event = {
        "type": "m.room.message",
        "sender": "@mallory:evil.example",
        "event_id": "$from-evil",
        "content": {"msgtype": "m.text", "body": "!gpu status node1"},
    }
    await matrix.bot.on_event(world.room, event)
    await matrix.bot.drain()
    said = await matrix.said(lambda e: notice(e) and "evil.example" in e["content"]["body"])
    assert (
        "accounts of another homeserver (evil.example) cannot use gpubot"
        in (said["content"]["body"])
    )
    assert "\n" not in said["content"]["body"].strip()
    assert await matrix.store.queries() == []  # nothing was asked of the fleet


async def test_an_approver_denies_by_typing(matrix: MatrixHarness, node1: Any) -> None:
    world = matrix.world
    bob, carol = world.users["bob"], world.users["carol"]
    w = node1.spawn(gpu=2, mib=3000)
    await bob.say(world.room, "!gpu reset node1 gpu 2")
    request = await matrix.said(lambda e: APPROVAL_KEY in e["content"])
    approval_id = request["content"][APPROVAL_KEY]
    await carol.say(world.room, f"!gpu deny {approval_id}")
    await matrix.said(
        lambda e: (
            e["content"].get("m.relates_to", {}).get("event_id") == request["event_id"]
            and "Denied by" in e["content"].get("m.new_content", {}).get("body", "")
        )
    )
    await matrix.bot.drain()
    assert alive(w.pid)
    approval = await matrix.store.approvals.get(approval_id)
    assert approval is not None and approval.state is ApprovalState.DENIED
    assert approval.decided_by == carol.user_id


async def test_a_restarted_bot_does_not_replay_old_commands(
    matrix_world: MatrixWorld, slack_fleet: Any, slack_settings: Any, tmp_path: Any
) -> None:
    world, bob = matrix_world, matrix_world.users["bob"]
    settings = matrix_settings(world, slack_settings, workload_owner(slack_fleet))
    db = f"sqlite:///{tmp_path}/audit.db"
    async with running_matrix_bot(world, settings, db) as first:
        await bob.say(world.room, "!gpu help")
        await first.said(lambda e: notice(e) and "!gpu" in e["content"]["body"])
        await first.bot.drain()
    before = len(await bob.from_user(world.room, world.bot_id))
    async with running_matrix_bot(world, settings, db) as again:
        await bob.say(world.room, "!gpu status node9")  # a new command: answered
        await again.said(lambda e: notice(e) and "node9" in e["content"]["body"])
        await again.bot.drain()
    after = await bob.from_user(world.room, world.bot_id)
    assert len(after) == before + 1, [e["content"]["body"][:60] for e in after]


async def test_a_claims_dm_reaches_the_person_on_matrix_once(matrix: MatrixHarness) -> None:
    """The DM port the claims' duty tells holders and waiters through (``FrontEnd.dm``): a DM
    room is opened with the person, and the message is posted once through the outbox, however
    often the duty asks."""
    world, alice = matrix.world, matrix.world.users["alice"]
    dm = matrix.app.flows.claims.dm
    msg = note("⏳ node1 GPU 2 is held for you until 12:00 UTC")
    subject = "dm:claims:offer:test"
    assert await dm(alice.user_id, msg, subject)
    assert await dm(alice.user_id, msg, subject)  # asked again: already there
    sync = await alice.call("GET", "/sync?timeout=0")
    (room,) = sync["rooms"]["invite"]
    invite = sync["rooms"]["invite"][room]["invite_state"]["events"]
    me = [e for e in invite if e["type"] == "m.room.member" and e["state_key"] == alice.user_id]
    assert me and me[0]["content"].get("is_direct") is True
    await alice.join(room)
    said = [e for e in await alice.from_user(room, world.bot_id) if notice(e)]
    assert [e["content"]["body"] for e in said] == [to_matrix(msg)["body"]]
    assert await matrix.store.outbox.recorded(subject)
