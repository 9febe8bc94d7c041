"""The bolt app over HTTP: real signature checks, acknowledgements, usage errors, dedupe, Home."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any

import pytest

from tests.fixtures.slack import FakeSlack, Harness, sign, slack_settings_for, workload_owner


@pytest.fixture(scope="module")
def slack_settings(slack_fleet: Any) -> Any:
    """Short SSH timeouts here: one test waits for a hung node to time out."""
    owner = workload_owner(slack_fleet)
    return slack_settings_for(slack_fleet.config_path, owner, command_timeout_s=3.0)


def posted(fake: FakeSlack) -> list[str]:
    return [c.method for c in fake.calls if c.method.startswith(("chat.", "views."))]


async def test_bad_signature_is_401_and_nothing_runs(harness: Harness) -> None:
    body = harness.send.command_body("status node1")
    reply = await harness.send.send(
        body, "application/x-www-form-urlencoded", signature="v0=" + "0" * 64
    )
    assert reply.status == 401
    forged = sign("not-the-secret-000000000000", body, int(time.time()))
    reply = await harness.send.send(body, "application/x-www-form-urlencoded", signature=forged)
    assert reply.status == 401
    await harness.settle()
    assert posted(harness.fake) == []
    assert await harness.store.queries() == []  # no status query was even recorded


async def test_stale_timestamp_is_401(harness: Harness) -> None:
    old = int(time.time()) - 6 * 60
    body = harness.send.command_body("status node1")
    reply = await harness.send.send(body, "application/x-www-form-urlencoded", timestamp=old)
    assert reply.status == 401
    # the same body signed now is accepted: only the age was wrong
    ok = await harness.send.send(body, "application/x-www-form-urlencoded")
    assert ok.status == 200
    await harness.settle()
    assert posted(harness.fake) == ["chat.postMessage", "chat.update"]


async def test_tampered_body_is_401(harness: Harness) -> None:
    ts = int(time.time())
    body = harness.send.command_body("status node1")
    signature = sign(harness.send.secret, body, ts)
    evil = body.replace("status", "reset")
    reply = await harness.send.send(
        evil, "application/x-www-form-urlencoded", timestamp=ts, signature=signature
    )
    assert reply.status == 401


async def test_usage_errors_are_the_ephemeral_ack(harness: Harness) -> None:
    cases = {
        "frobnicate": "unknown command 'frobnicate'",
        "stauts": "did you mean 'status'",
        "status nodeX": "unknown node or group 'nodeX'",
        "reset node9": "unknown node 'node9'",
        "reset node1 gpu x": "bad GPU number 'x'",
        "reset node1;reboot": "bad node name",
        "reset node1 gpu 1 grace 9999": "bad grace '9999'",
        "status " + "n" * 400: "input too long",
    }
    for text, want in cases.items():
        reply = await harness.send.command(text)
        assert reply.status == 200 and reply.seconds < 3
        answer = reply.json()
        assert answer["response_type"] == "ephemeral"
        assert want in answer["text"], (text, answer["text"])
    await harness.settle()
    assert posted(harness.fake) == []  # nothing ran


async def test_help(harness: Harness) -> None:
    answer = (await harness.send.command("help")).json()
    assert answer["response_type"] == "ephemeral"
    assert "/gpu reset NODE" in answer["text"] and "/gpu audit" in answer["text"]
    assert "approve ID" not in answer["text"]  # Slack decides with buttons
    short = (await harness.send.command("help reset")).json()
    assert short["text"].startswith("/gpu reset NODE")


async def test_ack_within_3s_while_the_node_hangs(harness: Harness, slack_fleet: object) -> None:
    node = slack_fleet.node("node2")  # type: ignore[attr-defined]
    node.hang_server()
    try:
        reply = await harness.send.command("status node2")
        assert reply.status == 200 and reply.seconds < 3 and reply.text == ""
        await harness.settle()
    finally:
        node.start_server()
    first, last = harness.fake.of("chat.postMessage")[0], harness.fake.of("chat.update")[-1]
    assert "asking 1 node" in first.body["text"]
    assert last.body["ts"] == harness.fake.ok("chat.postMessage")[0].answer["ts"]
    assert "node2" in last.body["text"] and "failing" in last.body["text"]


async def test_repeated_command_delivery_runs_once(harness: Harness) -> None:
    body = harness.send.command_body("status node1", trigger_id="123.456.abc")
    first = await harness.send.send(body, "application/x-www-form-urlencoded")
    again = await harness.send.send(
        body,
        "application/x-www-form-urlencoded",
        headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"},
    )
    assert first.status == again.status == 200
    await harness.settle()
    assert len(harness.fake.of("chat.postMessage")) == 1
    assert len(await harness.store.queries()) == 1


async def test_home_tab_published_and_events_deduplicated(harness: Harness) -> None:
    event = {
        "type": "app_home_opened",
        "user": "U0OWNER",
        "channel": "D0HOME",
        "tab": "home",
        "event_ts": f"{time.time():.6f}",
    }
    body = harness.send.event_body(event, event_id="Ev0HOME1")
    assert (await harness.send.send(body, "application/json")).status == 200
    retry = await harness.send.send(body, "application/json", headers={"X-Slack-Retry-Num": "1"})
    assert retry.status == 200
    await harness.settle()
    (publish,) = harness.fake.of("views.publish")
    assert publish.body["user_id"] == "U0OWNER"
    view = publish.body["view"]
    assert view["type"] == "home" and len(view["blocks"]) <= 100
    texts = str(view)
    assert "Your processes" in texts and "Nodes:" in texts
    other = await harness.send.event({**event, "tab": "messages"})
    assert other.status == 200
    await harness.settle()
    assert len(harness.fake.of("views.publish")) == 1


async def test_home_tab_names_the_maintenance_windows_open_or_planned(harness: Harness) -> None:
    now = time.time()
    maint = harness.store.maint
    await maint.open("node1", now + 3600, 7200, "kernel update", by="U0CAROL", source="t", now=now)
    await maint.open("node2", now, 600, "bios flash", by="U0CAROL", source="t", now=now)
    await maint.end("node2", by="U0CAROL", source="t", now=now)  # over: not shown
    event = {"type": "app_home_opened", "user": "U0OWNER", "tab": "home"}
    assert (await harness.send.event({**event, "event_ts": f"{now:.6f}"})).status == 200
    await harness.settle()
    (publish,) = harness.fake.of("views.publish")
    texts = str(publish.body["view"])
    assert "node1 maintenance" in texts and "kernel update, by U0CAROL" in texts
    assert "bios flash" not in texts


async def test_url_verification_and_form_body_exactly_as_slack(harness: Harness) -> None:
    import json

    challenge = json.dumps({"token": "x", "challenge": "c-123", "type": "url_verification"})
    reply = await harness.send.send(challenge, "application/json")
    assert reply.status == 200 and "c-123" in reply.text
    # a slash command is form-encoded, '+' for spaces, as Slack sends it
    body = harness.send.command_body("status   node1")
    assert "text=status+++node1" in body and urllib.parse.parse_qs(body)["command"] == ["/gpu"]


async def test_many_commands_at_once_are_all_acknowledged_fast(harness: Harness) -> None:
    replies = await asyncio.gather(*(harness.send.command("status") for _ in range(8)))
    assert all(r.status == 200 and r.seconds < 3 for r in replies)
    await harness.settle()
    assert len(harness.fake.ok("chat.update")) == 8
