"""Slack end to end on the simulated fleet: signed requests in, recorded Web API calls out.

Workloads are real processes owned by the test's Unix user, which ``U0OWNER`` maps to; ``U0BOB``
maps to someone else, so his resets of them are forced kills that need on-call approval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from typing import Any

from gpubot.chat.reset_view import ACTION_APPROVE, ACTION_DENY, ACTION_RESET_GPU
from gpubot.core.models import ApprovalState
from gpubot.scheduler import IntervalScheduler
from gpubot.slack.blockkit import message_text
from tests.fixtures.slack import Call, Harness
from tests.fixtures.slack_flows import (
    Later,
    blocks_of,
    ephemeral_texts,
    forced_request,
    request_in_oncall,
    updates_of,
)
from tests.procs import alive, until


def table_rows(call: Call) -> list[list[str]]:
    return [
        [c["text"] for c in r] for b in blocks_of(call) if b["type"] == "table" for r in b["rows"]
    ]


def text_of(call: Call) -> str:
    return json.dumps(call.body, ensure_ascii=False)


async def test_status_of_one_node(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=1, mib=2048)
    reply = await harness.send.command("status node1", user="U0BOB")
    assert reply.status == 200 and reply.text == ""
    await harness.settle()
    post, update = harness.fake.of("chat.postMessage")[0], harness.fake.of("chat.update")[-1]
    assert post.body["channel"] == "C0GENERAL" and "asking 1 node" in post.body["text"]
    assert update.body["ts"] == post.answer["ts"]
    rows = table_rows(update)
    head = ["GPU", "Memory", "Util", "Processes (owner pid MiB workload command)", "Flags"]
    assert rows[0] == head
    assert [r[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    assert f"{w.user} {w.pid} 2048 MiB" in rows[2][3]
    assert rows[2][1].startswith("2048 / 143771 MiB")
    assert update.body["text"].startswith("node1: 4 GPUs, 1 busy")
    (query,) = await harness.store.queries()
    assert query.actor == "U0BOB" and query.source == "slack"


async def test_self_service_reset_runs_at_once(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=1, mib=4096)
    await harness.send.command("reset node1 gpu 1", user="U0OWNER")
    await harness.settle()
    assert not alive(w.pid)
    posts = harness.fake.ok("chat.postMessage")
    assert [p.body["channel"] for p in posts] == ["C0GENERAL"]  # nobody was asked to approve
    updates = updates_of(harness.fake, str(posts[0].answer["ts"]))
    texts = [text_of(u) for u in updates]
    assert any("SIGTERM: 1 sent" in t for t in texts)  # progress came in place
    final = updates[-1]
    assert "freed" in final.body["text"]
    rows = table_rows(final)
    assert rows[0] == ["GPU", "Before", "After", "Outcome", "Freed in"]
    assert rows[1][0] == "1" and rows[1][1].startswith("4096 MiB") and rows[1][3] == "✅ freed"
    assert rows[1][4].endswith(" s")
    (action,) = await harness.store.actions()
    assert action.kind == "reset" and action.actor == "U0OWNER" and action.status == "freed"
    assert action.command == "/gpu reset node1 gpu 1"


async def test_forced_reset_approved_runs_once(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    posts = harness.fake.ok("chat.postMessage")
    request = next(c for c in posts if c.body["channel"] == "C0ONCALL")
    text = text_of(request)
    assert "<@U0BOB> (bob) asks to free *node1* GPU 2" in text
    assert f"This kills processes of `{w.user}`: 1 process(es), 3000 MiB" in text
    waiting = harness.fake.ok("chat.update")[-1]
    assert waiting.body["channel"] == "C0GENERAL"
    assert "Waiting for an on-call approver" in text_of(waiting)

    reply = await harness.send.click(
        ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts
    )
    assert reply.status == 200 and reply.seconds < 3
    await harness.settle()
    assert not alive(w.pid)
    oncall = updates_of(harness.fake, ts)
    assert "Approved by <@U0CAROL>" in text_of(oncall[0])
    assert not any(b["type"] == "actions" for b in blocks_of(oncall[0]))  # buttons gone
    assert "freed" in oncall[-1].body["text"] or "✅ freed" in text_of(oncall[-1])
    assert table_rows(oncall[-1])[1][3] == "✅ freed"
    mine = updates_of(harness.fake, waiting.body["ts"])
    assert "✅ freed" in text_of(mine[-1])  # the requester sees the result too
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.EXECUTED and approval.decided_by == "U0CAROL"
    (action,) = await harness.store.actions()
    assert action.actor == "U0CAROL" and action.status == "freed"
    detail = await harness.store.action(action.id)
    assert detail.plan["approval_id"] == approval_id

    again = await harness.send.click(
        ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts
    )
    assert again.status == 200
    await harness.settle()
    assert "already executed" in ephemeral_texts(harness.fake)[-1]
    assert len(await harness.store.actions()) == 1


async def test_forced_reset_denied(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    await harness.send.click(ACTION_DENY, str(approval_id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert alive(w.pid)
    (update,) = updates_of(harness.fake, ts)
    assert "Denied by <@U0CAROL>" in text_of(update) and "nothing was killed" in text_of(update)
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.DENIED
    assert await harness.store.actions() == []


async def test_expired_request_is_refused_and_shown(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    approvals = harness.bot.services.approvals
    approvals.clock = Later(901)  # 15 minutes and a second later
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert alive(w.pid)
    assert "expired" in ephemeral_texts(harness.fake)[-1]
    assert "Expired at" in text_of(updates_of(harness.fake, ts)[-1])
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.EXPIRED
    assert await harness.store.actions() == []


async def test_expiry_sweep_updates_the_messages(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    harness.bot.services.approvals.clock = Later(901)
    expiry = IntervalScheduler(harness.expire, 0.1, first_after_s=0, name="approval-expiry")
    expiry.start()
    try:
        await harness.fake.wait_for(lambda: bool(updates_of(harness.fake, ts)))
    finally:
        await expiry.stop()
    assert "Expired at" in text_of(updates_of(harness.fake, ts)[-1])
    assert (await harness.store.approvals.get(approval_id)).state is ApprovalState.EXPIRED
    assert alive(w.pid)


async def test_self_approval_refused(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=3, mib=1000)
    await harness.send.command("reset node1 gpu 3", user="U0CAROL")  # an approver asks
    await harness.settle()
    approval_id, ts = request_in_oncall(harness.fake)
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert "cannot approve your own forced kill" in ephemeral_texts(harness.fake)[-1]
    assert alive(w.pid)
    assert (await harness.store.approvals.get(approval_id)).state is ApprovalState.PENDING
    assert updates_of(harness.fake, ts) == []


async def test_non_approver_refused_then_group_member_approves(
    harness: Harness, node1: Any
) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    harness.fake.groups["S0ONCALL"] = ["U0ERIN"]
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0DAVE", message_ts=ts)
    await harness.settle()
    assert "only on-call approvers" in ephemeral_texts(harness.fake)[-1]
    assert alive(w.pid)
    assert (await harness.store.approvals.get(approval_id)).state is ApprovalState.PENDING
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0ERIN", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)
    assert len(harness.fake.ok("usergroups.users.list")) == 1  # read from Slack, then cached
    assert (await harness.store.approvals.get(approval_id)).decided_by == "U0ERIN"


async def test_double_click_and_two_approvers_run_it_once(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    harness.fake.groups["S0ONCALL"] = ["U0ERIN"]
    clicks = [
        harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts),
        harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts),
        harness.send.click(ACTION_APPROVE, str(approval_id), user="U0ERIN", message_ts=ts),
    ]
    replies = await asyncio.gather(*clicks)
    assert all(r.status == 200 for r in replies)
    await harness.settle()
    assert not alive(w.pid)
    assert len(await harness.store.actions()) == 1  # one reset, whoever won
    refused = [t for t in ephemeral_texts(harness.fake) if "already" in t]
    assert len(refused) == 2
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.EXECUTED


async def test_duplicated_click_delivery_is_dropped(harness: Harness, node1: Any) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    body = harness.send.action_body(
        ACTION_DENY, str(approval_id), user="U0CAROL", message_ts=ts, action_ts="1700000123.000001"
    )
    for _ in range(3):
        reply = await harness.send.send(body, "application/x-www-form-urlencoded")
        assert reply.status == 200
    await harness.settle()
    assert len(updates_of(harness.fake, ts)) == 1
    assert ephemeral_texts(harness.fake) == []  # not even an "already decided"
    assert alive(w.pid)


async def test_node_permissions_are_checked_before_planning(harness: Harness) -> None:
    await harness.send.command("reset node2 gpu 0", user="U0EVE")
    await harness.settle()
    assert "you may not reset GPUs on node2" in ephemeral_texts(harness.fake)[-1]
    assert harness.fake.of("chat.postMessage") == []  # not even a plan was made


async def test_rate_limited_post_waits_and_succeeds(harness: Harness, node1: Any) -> None:
    harness.fake.fail("chat.postMessage", "ratelimited", status=429, retry_after=1)
    started = time.monotonic()
    await harness.send.command("status node1")
    await harness.settle()
    calls = harness.fake.of("chat.postMessage")
    assert [c.status for c in calls] == [429, 200]
    assert calls[1].at - calls[0].at >= 1.0  # Retry-After was honoured
    assert time.monotonic() - started < 30
    assert harness.fake.ok("chat.update")[-1].body["ts"] == calls[1].answer["ts"]


async def test_rejected_table_falls_back_to_preformatted(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=0, mib=1234)
    harness.fake.fail("chat.update", "invalid_blocks")  # e.g. a workspace without table blocks
    await harness.send.command("status node1")
    await harness.settle()
    failed, retried = harness.fake.of("chat.update")
    assert failed.status == 200 and failed.answer["error"] == "invalid_blocks"
    assert any(b["type"] == "table" for b in blocks_of(failed))
    assert retried.answer["ok"] and not any(b["type"] == "table" for b in blocks_of(retried))
    assert f"{w.pid} 1234 MiB" in text_of(retried) and "```" in text_of(retried)


async def test_rejected_blocks_fall_back_to_text(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=0, mib=1234)
    harness.fake.fail("chat.update", "msg_too_long", times=2)
    await harness.send.command("status node1")
    await harness.settle()
    *failed, retried = harness.fake.of("chat.update")
    assert [f.answer["error"] for f in failed] == ["msg_too_long", "msg_too_long"]
    assert retried.answer["ok"] and not retried.body.get("blocks")
    assert f"{w.pid} 1234 MiB" in retried.body["text"]  # the content survives as text


async def test_failed_update_posts_a_new_message(harness: Harness, node1: Any) -> None:
    harness.fake.fail("chat.update", "message_not_found")
    await harness.send.command("status node1")
    await harness.settle()
    assert [c.answer["ok"] for c in harness.fake.of("chat.update")] == [False]
    first, second = harness.fake.ok("chat.postMessage")
    assert "asking" in first.body["text"] and second.body["text"].startswith("node1:")


async def test_slack_outage_keeps_the_audit_and_the_approval_right(
    harness: Harness, node1: Any
) -> None:
    w, approval_id, ts = await forced_request(harness, node1)
    for method in ("chat.update", "chat.postMessage"):
        harness.fake.fail(method, "service_unavailable", status=503, times=50)
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)  # the reset ran although nothing could be shown
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.EXECUTED
    (action,) = await harness.store.actions()
    assert action.status == "freed"
    assert (await harness.store.verify()).ok


async def test_alert_button_starts_the_same_flow(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=1, mib=500)
    await harness.send.click(ACTION_RESET_GPU, "node1:1", user="U0BOB", channel="C0GENERAL")
    await harness.settle()
    approval_id, _ = request_in_oncall(harness.fake)  # bob's click is a forced kill
    approval = await harness.store.approvals.get(approval_id)
    assert approval.requester == "U0BOB" and approval.plan.gpus == (1,)
    assert alive(w.pid)
    await harness.send.click(ACTION_RESET_GPU, "node1;x:1", user="U0BOB")
    await harness.settle()
    assert "bad node name" in ephemeral_texts(harness.fake)[-1]


async def test_sweep_now(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=2, mib=6000, behaviour="orphan")
    os.kill(w.pid, signal.SIGKILL)  # its memory stays behind: orphaned VRAM
    await until(lambda: not alive(w.pid), 10, f"workload {w.pid} to die")
    await harness.send.command("sweep", user="U0BOB")
    await harness.settle()
    first, last = harness.fake.of("chat.postMessage")[0], harness.fake.ok("chat.update")[-1]
    assert "sweeping" in first.body["text"]
    assert last.body["ts"] == first.answer["ts"]
    shown = message_text(last.body)
    assert "node1 GPU 2: orphaned-vram: 6000 MiB in use" in shown, shown
    (query,) = await harness.store.queries()
    assert query.source == "slack" and query.data["query"] == "sweep"

    await harness.send.command("gpu-reset node1 gpu 2", user="U0OWNER")  # the fix it suggests
    await harness.settle()
    done = harness.fake.ok("chat.update")[-1]
    assert "GPU reset node1 · GPU 2 · freed" in message_text(done.body)
    (action,) = await harness.store.actions()
    assert action.kind == "gpu-reset" and action.status == "freed"


async def test_identity_from_the_profile_email(harness: Harness, node1: Any) -> None:
    approvals = harness.bot.services.approvals
    policy = dataclasses.replace(
        approvals.policy, email_local_part=True, email_domains=("example.org",), permissions=None
    )
    approvals.policy = policy
    w = node1.spawn(gpu=3, mib=700)
    harness.fake.emails["U0FRANK"] = f"{w.user}@example.org"  # Frank is the owner on the boxes
    await harness.send.command("reset node1 gpu 3", user="U0FRANK")
    await harness.settle()
    assert not alive(w.pid)  # his own processes: no approval needed
    assert not [c for c in harness.fake.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
    assert [c.body["user"] for c in harness.fake.of("users.info")] == ["U0FRANK"]

    w2 = node1.spawn(gpu=3, mib=700)
    harness.fake.emails["U0GINA"] = f"{w2.user}@elsewhere.com"  # not a trusted domain
    await harness.send.command("reset node1 gpu 3", user="U0GINA")
    await harness.settle()
    assert alive(w2.pid)
    request_in_oncall(harness.fake)  # unknown on the boxes: every kill is forced
    assert "no known Linux user" in text_of(harness.fake.ok("chat.update")[-1])


async def test_unpostable_request_tells_the_requester_how_to_decide(
    harness: Harness, node1: Any
) -> None:
    w = node1.spawn(gpu=2, mib=800)
    harness.fake.fail("chat.postMessage", "not_in_channel", channel="C0ONCALL")
    await harness.send.command("reset node1 gpu 2", user="U0BOB")
    await harness.settle()
    waiting = harness.fake.ok("chat.update")[-1]
    assert "could not be posted for the approvers" in text_of(waiting)
    assert "approve 1" in text_of(waiting)
    approval = await harness.store.approvals.get(1)
    assert approval is not None and approval.state is ApprovalState.PENDING
    assert approval.ref is None and alive(w.pid)
