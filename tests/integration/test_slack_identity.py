"""Who may act and who may approve, through signed Slack requests into the real bolt app.

Guests, other workspaces, deleted accounts, bots and mappings to root are refused with one
ephemeral line and never mapped; a uid below ``[users] min_uid`` is never self-service; one
person behind two Slack accounts cannot approve their own request; an approver list that cannot
be refreshed decides nothing. Every refusal is in the audit log (``gpubot audit list``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pwd
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpubot.chat.reset_view import ACTION_APPROVE
from gpubot.cli import main
from gpubot.core.models import ApprovalState
from gpubot.errors import ConfigError
from gpubot.services.reset import reset_lock
from gpubot.store import Store, open_store
from tests.fixtures.approvals import request_on
from tests.fixtures.serve import env_with, run_serve
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import (
    BOT_TOKEN,
    SECRET,
    FakeSlack,
    Harness,
    running_bot,
    slack_tables,
)
from tests.fixtures.slack_flows import (
    Later,
    ephemeral_texts,
    request_in_oncall,
    updates_of,
)
from tests.procs import alive


@contextlib.asynccontextmanager
async def bot_with(
    slack_settings: Any, fake: FakeSlack, tmp_path: Path, **tables: dict[str, Any]
) -> AsyncIterator[Harness]:
    """Run a bot whose settings tables are the Slack tests' ones updated with ``tables``."""
    merged = slack_tables(slack_settings.policy.users["U0OWNER"])
    for table, values in tables.items():
        merged[table] = {**merged.get(table, {}), **values}
    settings = with_tables(slack_settings, merged)
    async with running_bot(settings, fake, f"sqlite:///{tmp_path}/audit.db") as h:
        yield h


async def refused_actions(store: Store) -> list[Any]:
    return [a for a in await store.actions() if a.status == "refused"]


async def audit_cli(store: Store, tmp_path: Path, capsys: Any, *argv: str) -> str:
    """Run ``gpubot audit ...`` on the bot's database; return what it printed."""
    cfg = tmp_path / "cli.toml"
    cfg.write_text(f'[database]\nurl = "{store.url}"\n', encoding="utf-8")
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--config", str(cfg), "audit", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return str(out)


ACCOUNTS = [
    ("guest", {"is_restricted": True}, "guest accounts cannot use gpubot"),
    ("single-channel guest", {"is_ultra_restricted": True}, "guest accounts cannot use gpubot"),
    ("stranger", {"is_stranger": True}, "accounts of another workspace cannot use gpubot"),
    ("other workspace", {"team_id": "T0OTHER"}, "accounts of another workspace cannot use"),
    ("deleted", {"deleted": True}, "this chat account is deactivated"),
    ("bot", {"is_bot": True}, "bots cannot use gpubot"),
]


@pytest.mark.parametrize(("what", "flags", "reason"), ACCOUNTS, ids=[a[0] for a in ACCOUNTS])
async def test_refused_accounts_are_told_why_and_never_mapped(
    harness: Harness, node1: Any, what: str, flags: dict[str, Any], reason: str
) -> None:
    w = node1.spawn(gpu=1, mib=1000)
    harness.fake.users["U0BOB"] = flags  # bob is in [users] and [permissions]: still refused
    reply = await harness.send.command("reset node1 gpu 1", user="U0BOB")
    assert reply.status == 200
    await harness.settle()
    (text,) = ephemeral_texts(harness.fake)
    assert reason in text and "\n" not in text
    assert harness.fake.of("chat.postMessage") == []  # nothing planned, nothing asked
    assert alive(w.pid)
    (refusal,) = await refused_actions(harness.store)
    assert (refusal.actor, refusal.kind, refusal.node) == ("U0BOB", "reset", "node1")
    assert refusal.command == "/gpu reset node1 gpu 1"
    detail = await harness.store.action(refusal.id)
    assert reason in detail.result["reason"] and detail.plan["who"]["linux_user"] is None
    # a status is refused too: a guest sees nobody's command lines
    await harness.send.command("status node1", user="U0BOB")
    await harness.settle()
    assert reason in ephemeral_texts(harness.fake)[-1]
    assert harness.fake.of("chat.postMessage") == []


async def test_slackbot_is_refused(harness: Harness) -> None:
    await harness.send.command("status node1", user="USLACKBOT")
    await harness.settle()
    assert "bots cannot use gpubot" in ephemeral_texts(harness.fake)[-1]
    assert harness.fake.of("users.info") == []  # refused before asking Slack about it


async def test_an_account_that_cannot_be_checked_is_refused(harness: Harness) -> None:
    harness.fake.fail("users.info", "internal_error")
    await harness.send.command("status node1", user="U0BOB")
    await harness.settle()
    assert "cannot check your chat account just now" in ephemeral_texts(harness.fake)[-1]
    assert harness.fake.of("chat.postMessage") == []


async def test_a_guest_home_tab_shows_the_reason_and_no_fleet(harness: Harness) -> None:
    harness.fake.users["U0GUEST"] = {"is_restricted": True}
    await harness.send.event(
        {
            "type": "app_home_opened",
            "user": "U0GUEST",
            "tab": "home",
            "channel": "D0HOME",
            "event_ts": f"{time.time():.6f}",
        }
    )
    await harness.settle()
    (publish,) = harness.fake.of("views.publish")
    view = json.dumps(publish.body["view"])
    assert "guest accounts cannot use gpubot" in view and "Nodes:" not in view


@pytest.mark.parametrize(
    ("tables", "email"),
    [
        ({"users": {"U0ZED": "root"}}, None),  # the [users] table
        ({"users": {"U0ZED": "nvidia-persistenced"}}, None),  # a [reset] system user
        (
            {"users": {"email_local_part": True, "email_domains": ["example.org"]}},
            "root@example.org",
        ),  # the profile e-mail
    ],
    ids=["table", "system-user", "e-mail"],
)
async def test_a_mapping_to_root_is_refused(
    slack_settings: Any,
    fake_slack: FakeSlack,
    tmp_path: Path,
    node1: Any,
    tables: dict[str, Any],
    email: str | None,
) -> None:
    w = node1.spawn(gpu=2, mib=1000)
    if email is not None:
        fake_slack.emails["U0ZED"] = email
    tables = {**tables, "permissions": {"*": ["*"]}}
    async with bot_with(slack_settings, fake_slack, tmp_path, **tables) as h:
        await h.send.command("reset node1 gpu 2", user="U0ZED")
        await h.settle()
        (text,) = ephemeral_texts(h.fake)
        assert "maps to the system account" in text and "gpubot never acts as it" in text
        assert h.fake.of("chat.postMessage") == [] and alive(w.pid)
        (refusal,) = await refused_actions(h.store)
        assert refusal.actor == "U0ZED"


async def test_low_uid_is_never_self_service(
    slack_settings: Any, slack_fleet: Any, fake_slack: FakeSlack, tmp_path: Path, node1: Any
) -> None:
    w = node1.spawn(gpu=3, mib=1000)  # U0OWNER's own process ...
    floor = pwd.getpwnam(w.user).pw_uid + 1  # ... whose uid is below the floor
    async with bot_with(slack_settings, fake_slack, tmp_path, users={"min_uid": floor}) as h:
        await h.send.command("reset node1 gpu 3", user="U0OWNER")
        await h.settle()
        (text,) = ephemeral_texts(h.fake)
        assert f"Self-service refused: {w.user} has uid {floor - 1} on node1" in text
        assert f"below [users] min_uid ({floor})" in text
        request_in_oncall(h.fake)  # on-call may still approve it
        assert alive(w.pid)
        (refusal,) = await refused_actions(h.store)
        detail = await h.store.action(refusal.id)
        assert refusal.actor == "U0OWNER" and "min_uid" in detail.result["reason"]
        (pending,) = await h.store.approvals.pending()
        assert pending.requester == "U0OWNER"


async def test_email_mapping_without_domains_does_not_start(
    tmp_path: Path, fake_slack: FakeSlack
) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    store = open_store(db, check_schema=False)
    store.upgrade()
    store.close()
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{db}"\n\n[users]\nemail_local_part = true\n')
    env = env_with(
        SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=fake_slack.base_url
    )
    code, err = await run_serve(cfg, env, "--http", "--port", "1")
    assert code != 0
    (line,) = err.strip().splitlines()
    assert line.startswith("gpubot: error: ") and "users.email_local_part" in line
    assert "users.email_domains" in line


async def test_email_mapping_without_domains_is_a_config_error_in_the_bot(
    slack_settings: Any, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"users\.email_local_part: needs users\.email_domains"):
        async with bot_with(slack_settings, fake_slack, tmp_path, users={"email_local_part": True}):
            pass


async def test_two_accounts_of_one_person_cannot_approve_each_other(
    slack_settings: Any, fake_slack: FakeSlack, tmp_path: Path, node1: Any, capsys: Any
) -> None:
    w = node1.spawn(gpu=2, mib=3000)
    fake_slack.groups["S0ONCALL"] = ["U0ERIN"]
    tables: dict[str, dict[str, Any]] = {
        "users": {"U0CAROL2": "carol"},
        "permissions": {"*": ["*"]},
    }
    async with bot_with(slack_settings, fake_slack, tmp_path, **tables) as h:
        await h.send.command("reset node1 gpu 2", user="U0CAROL2")  # carol's second account
        await h.settle()
        approval_id, ts = request_in_oncall(h.fake)
        await h.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await h.settle()
        text = ephemeral_texts(h.fake)[-1]
        assert "a request of your own Linux user (carol) made from another chat account" in text
        assert alive(w.pid) and updates_of(h.fake, ts) == []
        assert (await h.store.approvals.get(approval_id)).state is ApprovalState.PENDING
        (refusal,) = await refused_actions(h.store)
        assert (refusal.actor, refusal.kind, refusal.command) == (
            "U0CAROL",
            "approve",
            f"approve {approval_id}",
        )

        listed = await audit_cli(h.store, tmp_path, capsys, "list")
        line = next(x for x in listed.splitlines() if "refused" in x)
        assert "U0CAROL" in line and f"approve {approval_id}" in line

        await h.send.click(ACTION_APPROVE, str(approval_id), user="U0ERIN", message_ts=ts)
        await h.settle()
        assert not alive(w.pid)  # another person approves it
        approval = await h.store.approvals.get(approval_id)
        assert approval.state is ApprovalState.EXECUTED and approval.decided_by == "U0ERIN"


async def test_a_stale_approver_group_decides_nothing(
    harness: Harness, node1: Any, capsys: Any, tmp_path: Path
) -> None:
    w = node1.spawn(gpu=2, mib=3000)
    harness.fake.groups["S0ONCALL"] = ["U0ERIN"]
    await harness.send.command("reset node1 gpu 2", user="U0BOB")  # reads the group: cached
    await harness.settle()
    approval_id, ts = request_in_oncall(harness.fake)
    assert len(harness.fake.ok("usergroups.users.list")) == 1
    approvals = harness.bot.services.approvals
    approvals.clock = Later(61)  # past [approvals] group_cache_s (60)
    harness.fake.fail("usergroups.users.list", "internal_error", times=3)
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0ERIN", message_ts=ts)
    await harness.settle()
    text = ephemeral_texts(harness.fake)[-1]
    assert "cannot read the on-call user group S0ONCALL (usergroups.users.list" in text
    assert "[approvals] group_cache_s" in text
    assert alive(w.pid)
    assert (await harness.store.approvals.get(approval_id)).state is ApprovalState.PENDING
    (refusal,) = await refused_actions(harness.store)
    assert (refusal.actor, refusal.kind) == ("U0ERIN", "approve")

    harness.fake.failures.clear()  # Slack answers again: the fresh list decides
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0ERIN", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)
    assert (await harness.store.approvals.get(approval_id)).decided_by == "U0ERIN"


async def test_refused_clicks_are_in_audit_list(
    harness: Harness, node1: Any, capsys: Any, tmp_path: Path
) -> None:
    node1.spawn(gpu=0, mib=500)
    harness.fake.groups["S0ONCALL"] = []
    await harness.send.command("reset node1 gpu 0", user="U0BOB")
    await harness.settle()
    approval_id, ts = request_in_oncall(harness.fake)
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0DAVE", message_ts=ts)
    harness.fake.users["U0GUEST"] = {"is_restricted": True}
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0GUEST", message_ts=ts)
    await harness.send.command("reset node2 gpu 0", user="U0EVE")  # not permitted on node2
    await harness.settle()

    listed = await audit_cli(harness.store, tmp_path, capsys, "list")
    refused = [x for x in listed.splitlines() if " refused " in x]
    assert len(refused) == 3, listed
    assert any("U0DAVE" in x and f"approve {approval_id}" in x for x in refused)
    assert any("U0GUEST" in x and f"approve {approval_id}" in x for x in refused)
    assert any("U0EVE" in x and "/gpu reset node2 gpu 0" in x for x in refused)
    as_json = json.loads(await audit_cli(harness.store, tmp_path, capsys, "list", "--json"))
    dave = next(a for a in as_json if a["actor"] == "U0DAVE")
    assert (dave["status"], dave["kind"], dave["node"]) == ("refused", "approve", "node1")
    shown = await audit_cli(harness.store, tmp_path, capsys, "show", str(dave["id"]))
    assert "only on-call approvers can decide requests for approval" in shown  # why


async def test_a_refusal_is_audited_while_another_decision_is_in_flight(
    harness: Harness, node1: Any
) -> None:
    w = node1.spawn(gpu=1, mib=500)
    await harness.send.command("reset node1 gpu 1", user="U0BOB")
    await harness.settle()
    approval_id, ts = request_in_oncall(harness.fake)
    harness.bot.flows.requests.deciding.add(approval_id)  # as while an approver's click runs
    try:
        await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0DAVE", message_ts=ts)
        await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await harness.settle()
    finally:
        harness.bot.flows.requests.deciding.discard(approval_id)
    refused = [a for a in await harness.store.actions() if a.status == "refused"]
    assert [(a.actor, a.command) for a in refused] == [("U0DAVE", f"approve {approval_id}")]
    told = " ".join(
        c.body.get("text", "") for c in harness.fake.calls if c.method.startswith("response:")
    )
    assert f"Request #{approval_id} is being decided already" in told  # carol: wait, not refused
    assert alive(w.pid)


async def test_a_forced_action_records_requester_approver_and_approval(
    harness: Harness, node1: Any, capsys: Any, tmp_path: Path
) -> None:
    w = node1.spawn(gpu=1, mib=2000)
    await harness.send.command("reset node1 gpu 1", user="U0BOB")
    await harness.settle()
    approval_id, ts = request_in_oncall(harness.fake)
    await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)
    (action,) = await harness.store.actions()
    doc = json.loads(
        await audit_cli(harness.store, tmp_path, capsys, "show", str(action.id), "--json")
    )
    record = doc["approval"]
    assert (record["id"], record["requester"], record["approver"]) == (
        approval_id,
        "U0BOB",
        "U0CAROL",
    )
    assert (record["requester_user"], record["requester_name"]) == ("bob", "u0bob")
    text = await audit_cli(harness.store, tmp_path, capsys, "show", str(action.id))
    assert f"approval: #{approval_id} requested by U0BOB (u0bob), approved by U0CAROL" in text


async def test_an_approval_left_approved_is_reported_and_marked_incomplete(
    harness: Harness,
) -> None:
    store = harness.store
    asked = replace(request_on("node1"), command="/gpu reset node1 gpu 1")
    left = await store.approvals.create("U0BOB", "bob", "node1", asked, source="slack")
    busy = await store.approvals.create(
        "U0BOB", "bob", "node2", request_on("node2"), source="slack"
    )
    # another front end's (a Matrix gpubot on this database): its own start-up's to report
    other = await store.approvals.create(
        "@b:hs", "bob", "node3", request_on("node3"), source="matrix"
    )
    now = left.created_at
    for a in (left, busy, other):
        await store.approvals.decide(a.id, "U0CAROL", True, now, approver_name="carol")
    # node2's approval is being run by a live replica: it holds the node's reset lock
    locks = harness.bot.services.approvals.locks
    async with locks.hold(reset_lock("node2"), holder="another replica"):
        await harness.start_up()
    (post,) = harness.fake.ok("chat.postMessage")
    text = post.body["text"]
    assert "1 approved forced kill(s) never recorded an end" in text and "incomplete" in text
    assert f"approval #{left.id} on node1: asked by bob (U0BOB), approved by carol" in text
    assert "/gpu reset node1 gpu 1" in text and f"#{busy.id}" not in text
    assert f"#{other.id}" not in text
    marked = await store.approvals.get(left.id)
    assert marked.state is ApprovalState.INCOMPLETE and "gpubot stopped" in marked.result["error"]
    assert (await store.approvals.get(busy.id)).state is ApprovalState.APPROVED
    trail = [r.data for r in await store.records() if r.kind == "approval"]
    assert (trail[-1]["approval"], trail[-1]["to"]) == (left.id, "incomplete")
    await harness.start_up()  # once only: nothing new to say about it
    assert len(harness.fake.ok("chat.postMessage")) == 2  # busy's, now that nothing holds it
    assert (await store.approvals.get(busy.id)).state is ApprovalState.INCOMPLETE
    assert (await store.approvals.get(other.id)).state is ApprovalState.APPROVED
