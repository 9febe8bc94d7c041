"""gpubot on Matrix, end to end: real users type and react on a real Synapse, the bot answers
from the simulated fleet (workloads are real processes, killed by real signals)."""

from __future__ import annotations

from typing import Any

from gpubot.core.models import ApprovalState
from gpubot.matrix.render import APPROVAL_KEY
from tests.fixtures.matrix import MatrixHarness
from tests.procs import alive


def shown(e: dict[str, Any]) -> dict[str, Any]:
    """What an event of the bot shows: an edit's new content, else its own."""
    content: dict[str, Any] = e["content"]
    return content.get("m.new_content", content)  # type: ignore[no-any-return]


def notice(e: dict[str, Any]) -> bool:
    """A new notice of the bot (not an edit)."""
    content = e["content"]
    edit = content.get("m.relates_to", {}).get("rel_type") == "m.replace"
    return e["type"] == "m.room.message" and content.get("msgtype") == "m.notice" and not edit


async def test_status_answers_a_table_in_html_with_a_plain_fallback(
    matrix: MatrixHarness, node1: Any
) -> None:
    w = node1.spawn(gpu=1, mib=2048)
    room, bob = matrix.world.room, matrix.world.users["bob"]
    await bob.say(room, "!gpu status node1")

    def table(e: dict[str, Any]) -> bool:
        return "<table>" in shown(e).get("formatted_body", "")

    answer = shown(await matrix.said(table))  # the "asking" notice, edited into the answer
    assert answer["msgtype"] == "m.notice" and answer["format"] == "org.matrix.custom.html"
    html, plain = answer["formatted_body"], answer["body"]
    assert "<th>GPU</th>" in html and f"<td>{w.user} {w.pid} 2048 MiB" in html
    assert "<table>" not in plain and f"{w.user} {w.pid} 2048 MiB" in plain
    assert "<td>2048 / 143771 MiB" in html and "2048 / 143771" in plain
    (query,) = await matrix.store.queries()
    assert query.actor == bob.user_id and query.source == "matrix"


async def test_a_forced_reset_is_approved_once_by_reaction(
    matrix: MatrixHarness, node1: Any
) -> None:
    world = matrix.world
    room, bob, carol, dave = world.room, *(world.users[n] for n in ("bob", "carol", "dave"))
    w = node1.spawn(gpu=2, mib=3000)
    await bob.say(room, "!gpu reset node1 gpu 2")
    request = await matrix.said(lambda e: APPROVAL_KEY in e["content"])
    approval_id = request["content"][APPROVAL_KEY]
    body = request["content"]["body"]
    assert bob.user_id in body and f"processes of `{w.user}`" in body  # requester and owner
    assert f'href="https://matrix.to/#/{bob.user_id}"' in request["content"]["formatted_body"]
    assert alive(w.pid)

    # The requester's own ✅ runs nothing: only on-call approvers decide.
    await bob.react(room, request["event_id"], "✅")
    await matrix.said(lambda e: notice(e) and "cannot approve your own" in e["content"]["body"])
    assert alive(w.pid)

    await carol.react(room, request["event_id"], "✅")
    edited = await matrix.said(
        lambda e: (
            e["content"].get("m.relates_to", {}).get("event_id") == request["event_id"]
            and "freed" in e["content"].get("m.new_content", {}).get("body", "")
        )
    )
    assert "Approved by" in edited["content"]["m.new_content"]["body"]
    assert not alive(w.pid)
    await matrix.bot.drain()  # the decision's task records its end after the edit
    approval = await matrix.store.approvals.get(approval_id)
    assert approval is not None
    assert approval.state is ApprovalState.EXECUTED and approval.decided_by == carol.user_id

    await dave.react(room, request["event_id"], "✅")
    await matrix.said(lambda e: notice(e) and "already executed" in e["content"]["body"])
    await matrix.bot.drain()
    actions = await matrix.store.actions()
    (reset,) = [a for a in actions if a.kind == "reset" and a.status == "freed"]  # ran once
    assert reset.actor == carol.user_id
    assert {(a.actor, a.status) for a in actions if a is not reset} <= {(bob.user_id, "refused")}
