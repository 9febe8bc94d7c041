"""Approvals that tell the truth and do not stall, through signed Slack requests into the bolt
app and the loopback fake Web API (and the console): a reason carried into the request and the
audit log, unknown memory shown as unknown, one re-ping at half the expiry (two replicas and a
restart included), an expiry that edits the request and tells the requester, and a request
whose post times out that still appears once (its bot's Web API client giving up after
``QUICK_TIMEOUT_S``, the fake answering at ``LATE_S``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.chat.reset_view import ACTION_APPROVE
from gpubot.cli.console import identity
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.core.alerting import Lookup
from gpubot.core.clock import SystemClock
from gpubot.core.models import ApprovalState
from gpubot.slack.poster import EVENT, SlackPoster
from gpubot.store.tables import outbox
from tests.fixtures.slack import (
    LATE_S,
    QUICK_TIMEOUT_S,
    DmSlack,
    FakeSlack,
    Harness,
    assert_within_limits,
    running_bot,
)
from tests.procs import alive

ONCALL = "C0ONCALL"


class Later(SystemClock):
    """The system clock with wall time ``seconds`` ahead (deadlines keep real time)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def now(self) -> float:
        return time.time() + self.seconds


def text_of(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


def in_channel(fake: FakeSlack, channel: str) -> list[tuple[str, dict[str, Any]]]:
    """The messages in ``channel`` now, oldest first: what people see."""
    found = [(ts, m) for (c, ts), m in fake.messages.items() if c == channel]
    return sorted(found, key=lambda p: float(p[0]))


def requests_in(fake: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    return [(ts, m) for ts, m in in_channel(fake, ONCALL) if not m.get("thread_ts")]


def repings(fake: FakeSlack, ts: str) -> list[dict[str, Any]]:
    return [m for _, m in in_channel(fake, ONCALL) if m.get("thread_ts") == ts]


def set_clock(h: Harness, clock: SystemClock) -> None:
    h.bot.services.approvals.clock = clock  # the approval duty's clock too


async def approval_records(store: Any, approval_id: int) -> list[dict[str, Any]]:
    return [
        r.data
        for r in await store.records()
        if r.kind == "approval" and r.data.get("approval") == approval_id
    ]


async def ask(h: Harness, node1: Any, text: str, *, gpu: int = 2) -> tuple[Any, int, str]:
    """Bob asks for a forced kill of a workload on ``gpu``; return it, the id and the ts."""
    w = node1.spawn(gpu=gpu, mib=3000)
    await h.send.command(text, user="U0BOB")
    await h.settle()
    [(ts, msg)] = requests_in(h.fake)
    approval = (await h.store.approvals.pending())[-1]
    assert approval.ref == f"{ONCALL}/{ts}" and alive(w.pid)
    assert msg["metadata"]["event_type"] == EVENT
    return w, approval.id, ts


async def test_a_reason_goes_into_the_request_and_the_audit_records(
    harness: Harness, node1: Any
) -> None:
    w, aid, ts = await ask(
        harness, node1, "reset node1 gpu 2 because  the job is <hung>\n*since* 3 h &c"
    )
    [(_, request)] = requests_in(harness.fake)
    shown = text_of(request)
    # one line, escaped: no forged markup, no bold, no line of its own
    assert "Reason: “the job is &lt;hung&gt; ∗since∗ 3 h &amp;c”." in shown, shown
    approval = await harness.store.approvals.get(aid)
    assert approval.plan.reason == "the job is <hung> *since* 3 h &c"
    (created,) = [r for r in await approval_records(harness.store, aid) if r["to"] == "pending"]
    assert created["plan"]["reason"] == "the job is <hung> *since* 3 h &c"
    await harness.send.click(ACTION_APPROVE, str(aid), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)
    (action,) = await harness.store.actions()
    detail = await harness.store.action(action.id)
    assert detail.plan["reason"] == "the job is <hung> *since* 3 h &c"
    assert detail.approval["reason"] == "the job is <hung> *since* 3 h &c"
    assert action.command.startswith("/gpu reset node1 gpu 2 because")
    assert [t["pid"] for t in detail.plan["targets"]] == [w.pid]  # the reason signals nothing


async def test_a_reason_never_changes_the_plan(harness: Harness, node1: Any) -> None:
    """A reason naming GPUs and users is text: the plan is the one without it (a reason that
    reads like options, ``because gpu 3 pid 1``, is refused: ``tests/unit/test_reason.py``)."""
    w3 = node1.spawn(gpu=3, mib=500)
    line = "reset node1 gpu 2 because the gpu next to 3, user root asked"
    w, aid, _ = await ask(harness, node1, line)
    approval = await harness.store.approvals.get(aid)
    assert approval.plan.gpus == (2,) and [t.pid for t in approval.plan.targets] == [w.pid]
    assert approval.plan.reason == "the gpu next to 3, user root asked" and alive(w3.pid)


async def test_unknown_memory_is_shown_as_unknown(harness: Harness, node1: Any) -> None:
    hidden = node1.spawn(gpu=1, mib=3000, behaviour="hidden")  # found through its device file
    await harness.send.command("reset node1 gpu 1", user="U0BOB")
    await harness.settle()
    [(_, request)] = requests_in(harness.fake)
    approval = (await harness.store.approvals.pending())[-1]
    assert [t.mib for t in approval.plan.targets] == [None] and alive(hidden.pid)
    assert "1 process(es), memory unknown" in text_of(request)
    assert "0 MiB" not in text_of(request)
    assert approval.plan.total_mib == 0  # the control: what the request used to say, "0 MiB"
    node1.spawn(gpu=1, mib=2048)  # one known beside the unknown: at least, plus unknown
    await harness.send.command("reset node1 gpu 1", user="U0BOB")
    await harness.settle()
    second = requests_in(harness.fake)[-1][1]
    assert "2 process(es), ≥ 2048 MiB + unknown" in text_of(second)


async def test_unknown_memory_in_the_console(
    slack_settings: Any, tmp_path: Path, node1: Any
) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    settings = dataclasses.replace(slack_settings, database_url=url)
    app = build(settings, {}, need_store=True, front=ConsoleFront())
    try:
        flows = app.flows
        node1.spawn(gpu=1, mib=3000, behaviour="hidden")
        bob = identity(flows.svc.policy, "U0BOB")
        text = await answer(flows, "reset node1 gpu 1 because it hangs", bob)
        assert "1 process(es), memory unknown. Reason: “it hangs”." in text
        assert "0 MiB" not in text
        (approval,) = await app.store.approvals.pending()  # type: ignore[union-attr]
        assert approval.plan.reason == "it hangs"
    finally:
        await app.close()


async def test_re_ping_once_at_half_expiry_across_replicas_and_a_restart(
    harness: Harness, node1: Any, slack_settings: Any, tmp_path: Path
) -> None:
    _, aid, ts = await ask(harness, node1, "reset node1 gpu 2")
    await harness.expire()  # the control: before half the expiry, nobody is pinged
    set_clock(harness, Later(400))
    await harness.expire()
    assert repings(harness.fake, ts) == []
    set_clock(harness, Later(451))  # past half of 900 s: not run yet, so nothing either
    assert repings(harness.fake, ts) == []
    db = f"sqlite:///{tmp_path}/audit.db"
    async with running_bot(slack_settings, harness.fake, db) as replica:
        set_clock(replica, Later(451))
        await asyncio.gather(harness.expire(), replica.expire())
        await harness.expire()
    async with running_bot(slack_settings, harness.fake, db) as restarted:
        set_clock(restarted, Later(600))
        await restarted.expire()
    [ping] = repings(harness.fake, ts)
    assert ping["reply_broadcast"] in (True, "true", "1")
    assert "is still undecided" in text_of(ping) and "<@U0CAROL>, <!subteam^S0ONCALL>" in (
        text_of(ping)
    )
    assert ping["metadata"]["event_type"] == EVENT
    record, end = [r for r in await approval_records(harness.store, aid) if r.get("post")]
    assert record["reminded"] == ["U0CAROL", "S0ONCALL"]
    assert end["outcome"] == "posted" and end["token"] == record["token"]  # where it landed
    # the control: without its outbox row (the mark), the next run pings on-call again
    with harness.store.engine.begin() as conn:
        conn.execute(outbox.delete().where(outbox.c.subject == f"approval:{aid}:reping"))
    await harness.expire()
    assert len(repings(harness.fake, ts)) == 2


async def test_expiry_edits_the_request_and_tells_the_requester(
    slack_settings: Any, dm_slack: DmSlack, tmp_path: Path, node1: Any
) -> None:
    async with running_bot(slack_settings, dm_slack, f"sqlite:///{tmp_path}/a.db") as h:
        w, aid, ts = await ask(h, node1, "reset node1 gpu 2")
        mine = dm_slack.ok("chat.update")[-1].body["ts"]  # the requester's own message
        set_clock(h, Later(901))
        await h.expire()
        await h.expire()  # once: nothing more is told
        assert alive(w.pid)
        (edit,) = [c for c in dm_slack.ok("chat.update") if c.body["ts"] == ts]
        assert "Expired at <!date^" in text_of(edit.body) and "{time}|" in text_of(edit.body)
        assert "nobody decided; nothing was done" in text_of(edit.body)
        assert "actions" not in text_of(edit.body)  # no buttons left
        assert any(
            c.body["ts"] == mine and "nobody decided" in text_of(c.body)
            for c in dm_slack.ok("chat.update")
        )
        [(_, dm)] = in_channel(dm_slack, "D0BOB")
        assert "Your request #1" in text_of(dm) and "expired at <!date^" in text_of(dm)
        assert "nobody decided; nothing was done" in text_of(dm)
        assert dm["metadata"]["event_type"] == EVENT
        records = await approval_records(h.store, aid)
        assert [r["to"] for r in records if "to" in r] == ["pending", "expired"]
        (told,) = [r for r in records if r.get("post") == "expired" and "outcome" not in r]
        assert told["told"] == "U0BOB"
        assert (await h.store.approvals.get(aid)).state is ApprovalState.EXPIRED
    assert_within_limits(dm_slack)


async def slow_on_call_post(h: Harness, node1: Any) -> Any:
    """Bob asks; the on-call post's answer comes at ``LATE_S``, after the client's timeout
    (Slack took it at once)."""
    w = node1.spawn(gpu=2, mib=3000)
    sent = asyncio.create_task(h.send.command("reset node1 gpu 2", user="U0BOB"))
    await h.fake.wait_for(lambda: bool(h.fake.of("chat.postMessage")), 30)  # "planning …"
    h.fake.delays["chat.postMessage"] = LATE_S
    await h.fake.wait_for(
        lambda: any(c.body.get("channel") == ONCALL for c in h.fake.of("chat.postMessage")), 60
    )
    h.fake.delays.clear()
    await sent
    await h.settle()
    return w


async def test_a_request_whose_post_times_out_appears_once(
    quick_harness: Harness, node1: Any
) -> None:
    harness = quick_harness
    t0 = time.monotonic()
    w = await slow_on_call_post(harness, node1)
    assert time.monotonic() - t0 >= QUICK_TIMEOUT_S  # the client's timeout came first
    [(ts, _)] = requests_in(harness.fake)
    (posted,) = [c for c in harness.fake.of("chat.postMessage") if c.body["channel"] == ONCALL]
    (approval,) = await harness.store.approvals.pending()
    assert approval.ref == f"{ONCALL}/{ts}"  # found in the history
    assert harness.fake.of("conversations.history")
    waiting = harness.fake.ok("chat.update")[-1]
    assert "could not be posted" not in text_of(waiting.body)
    set_clock(harness, Later(120))  # the duty settles nothing more: it was adopted
    await harness.expire()
    assert len(requests_in(harness.fake)) == 1
    await harness.send.click(ACTION_APPROVE, str(approval.id), user="U0CAROL", message_ts=ts)
    await harness.settle()
    assert not alive(w.pid)
    # Slack did take the post: its late answer (LATE_S after it) comes after the client gave up.
    # The reset above may end before then on a fast box, so the answer is waited for here.
    await harness.fake.wait_for(lambda: posted.answered_at is not None, 15)


async def test_control_without_the_history_search_a_slow_post_appears_twice(
    quick_harness: Harness, node1: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing_there(self: SlackPoster, to: str, token: str, since: Any) -> Lookup:
        return Lookup(True)

    harness = quick_harness
    monkeypatch.setattr(SlackPoster, "find", nothing_there)
    await slow_on_call_post(harness, node1)
    (approval,) = await harness.store.approvals.pending()
    assert approval.ref is None  # not confirmed: pending in the outbox
    waiting = harness.fake.ok("chat.update")[-1]
    assert "did not confirm the request's post" in text_of(waiting.body)
    set_clock(harness, Later(120))  # the duty posts it again, as provably absent
    await harness.expire()
    assert len(requests_in(harness.fake)) == 2


def test_the_cli_reset_records_its_reason(slack_fleet: Any, node1: Any) -> None:
    import subprocess
    import sys

    def gpubot(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gpubot", "--config", str(slack_fleet.config_path), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    assert gpubot("db", "upgrade").returncode == 0
    w = node1.spawn(gpu=0, mib=512)
    why = "a hung\njob  <b>"
    dry = gpubot("reset", "node1", "--gpu", "0", "--because", why, "--dry-run")
    assert "because: a hung job <b>" in dry.stdout and alive(w.pid)
    p = gpubot("reset", "node1", "--gpu", "0", "--yes", "--force", "--json", "--because", why)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["plan"]["reason"] == "a hung job <b>" and not alive(w.pid)
    shown = gpubot("audit", "show", str(doc["action_id"]), "--json")
    assert json.loads(shown.stdout)["plan"]["reason"] == "a hung job <b>", shown.stdout


async def test_after_a_restart_an_unconfirmed_request_is_adopted_not_repeated(
    quick_harness: Harness,
    node1: Any,
    slack_settings: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def unreadable(self: SlackPoster, to: str, token: str, since: Any) -> Lookup:
        return Lookup(False, why="conversations.history: a timeout")

    harness = quick_harness
    with monkeypatch.context() as patched:  # the bot that posted could not confirm it
        patched.setattr(SlackPoster, "find", unreadable)
        await slow_on_call_post(harness, node1)
    [(ts, _)] = requests_in(harness.fake)
    (approval,) = await harness.store.approvals.pending()
    assert approval.ref is None
    async with running_bot(slack_settings, harness.fake, f"sqlite:///{tmp_path}/audit.db") as h:
        set_clock(h, Later(120))
        await h.expire()  # the restarted bot's duty finds it in the history
    assert len(requests_in(harness.fake)) == 1
    adopted = await harness.store.approvals.get(approval.id)
    assert adopted.ref == f"{ONCALL}/{ts}"
    assert await harness.store.outbox.pending("approval:", under=True) == []
