"""``gpubot console``: the same flows as Slack, typed on a terminal, answered as text."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, build
from gpubot.chat.alerts import render_alert_group
from gpubot.chat.flows import Flows
from gpubot.chat.idle import free_button
from gpubot.chat.message import Actions, Message
from gpubot.cli.console import console_parts, identity
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer, render
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.findings import IDLE_HOLDER, FindingKey
from gpubot.core.health.kinds import parse_key
from gpubot.core.models import ApprovalState
from gpubot.store import open_store
from tests.procs import alive

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def app(slack_settings: Any, tmp_path: Path) -> AsyncIterator[App]:
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    settings = dataclasses.replace(slack_settings, database_url=url)
    built = build(settings, {}, need_store=True, front=ConsoleFront())
    yield built
    await built.close()


@pytest.fixture
def flows(app: App) -> Flows:
    return app.flows


async def test_status_as_text(flows: Flows, node1: Any) -> None:
    w = node1.spawn(gpu=2, mib=2048)
    me = identity(flows.svc.policy, None)
    text = await answer(flows, "/gpu status node1", me)
    assert "== node1 · 4 × NVIDIA H200 ==" in text
    assert f"{w.user} {w.pid} 2048 MiB" in text
    assert re.search(r"(?m)^GPU +MEMORY MiB  MEM %  UTIL  PROCESSES", text)  # labelled columns
    bad = await answer(flows, "status node1 ;rm", me)
    assert bad.startswith("⚠ bad node or group name ';rm'")


async def test_own_processes_reset_at_once(flows: Flows, node1: Any) -> None:
    w = node1.spawn(gpu=1, mib=4096)
    local = identity(flows.svc.policy, None)
    assert local.id.startswith("console:")
    assert local.linux_user == (w.user if os.geteuid() != 0 else None)  # never root's own
    refused = await answer(flows, "reset node1 gpu 1", local)  # [permissions] name Slack ids
    assert "you may not reset GPUs on node1" in refused and alive(w.pid)
    me = identity(flows.svc.policy, "U0OWNER")
    assert me.linux_user == w.user
    lines: list[str] = []
    text = await answer(flows, "reset node1 gpu 1", me, echo=lines.append)
    assert not alive(w.pid)
    assert "Reset node1 · GPU 1 · freed" in text and "✅ freed" in text
    assert any("SIGTERM: 1 sent" in line for line in lines)  # progress was printed as it came
    assert flows.svc.audit is not None
    action, refusal = await flows.svc.audit.actions()
    assert action.source == "console" and action.actor == me.id
    assert (refusal.status, refusal.actor) == ("refused", local.id)  # who tried, and was refused


async def test_forced_kill_approved_by_typing(app: App, flows: Flows, node1: Any) -> None:
    w = node1.spawn(gpu=3, mib=1000)
    bob = identity(flows.svc.policy, "U0BOB")
    asked = await answer(flows, "reset node1 gpu 3", bob)
    assert "Approval needed · forced kill on node1" in asked
    line = next(x for x in asked.splitlines() if "an approver types: approve" in x)
    approval_id = int(line.split("approve ")[1].split()[0])
    assert alive(w.pid)

    refused = await answer(flows, f"approve {approval_id}", identity(flows.svc.policy, "U0DAVE"))
    assert "only on-call approvers" in refused
    own = await answer(flows, f"approve {approval_id}", bob)
    assert "cannot approve your own" in own
    assert alive(w.pid)

    carol = identity(flows.svc.policy, "U0CAROL")
    done = await answer(flows, f"approve {approval_id}", carol)
    assert "Approved by @U0CAROL" in done and "✅ freed" in done
    assert not alive(w.pid)
    assert app.store is not None
    approval = await app.store.approvals.get(approval_id)
    assert approval is not None and approval.state is ApprovalState.EXECUTED
    again = await answer(flows, f"deny {approval_id}", carol)
    assert "already executed" in again


async def test_requester_withdraws_with_deny(flows: Flows, node1: Any) -> None:
    w = node1.spawn(gpu=0, mib=500)
    bob = identity(flows.svc.policy, "U0BOB")
    asked = await answer(flows, "reset node1 gpu 0", bob)
    approval_id = int(asked.split("approve ")[-1].split()[0])
    text = await answer(flows, f"deny {approval_id}", bob)
    assert "Cancelled by @U0BOB" in text
    assert alive(w.pid)


async def test_a_console_sweep_is_audited_as_the_console(
    app: App, flows: Flows, node1: Any
) -> None:
    me = identity(flows.svc.policy, "U0OWNER")
    text = await answer(flows, "/gpu sweep", me)
    assert "Sweep: " in text
    assert app.store is not None
    (sweep,) = [r for r in await app.store.queries() if r.data["query"] == "sweep"]
    assert (sweep.source, sweep.actor) == ("console", "console:U0OWNER")


async def test_free_it_and_snooze_are_typed_at_the_console(
    app: App, flows: Flows, node1: Any
) -> None:
    w = node1.spawn(gpu=1, mib=4096)
    me = identity(flows.svc.policy, "U0OWNER")
    snap = await flows.svc.status.snapshot(flows.svc.status.node("node1"))
    held = next(p for p in snap.processes if p.pid == w.pid)
    idle = FindingKey("node1", 1, IDLE_HOLDER.value, f"{w.pid}:{held.start_ticks}")
    freed = await answer(flows, f"free {idle.text()}", me)
    assert "Reset node1 · GPU 1 · freed" in freed and not alive(w.pid)
    assert flows.svc.audit is not None
    (action,) = await flows.svc.audit.actions()
    assert (action.source, action.actor) == ("console", "U0OWNER")
    assert action.command == f"/gpu reset node1 gpu 1 pid {w.pid} (Free it)"
    again = await answer(flows, f"free {idle.text()}", me)
    assert f"pid {w.pid} no longer holds node1 GPU 1" in again  # nothing reset on its word
    assert len(await flows.svc.audit.actions()) == 1

    assert app.store is not None
    await app.store.alerts.upsert_seen([idle], datetime.now(UTC))
    snoozer = console_parts(app).snoozer
    quiet = await answer(flows, f"snooze 1h {idle.text()}", me, snoozer=snoozer)
    assert "🔕 node1 GPU 1: idle-holder snoozed until" in quiet
    (alert,) = await app.store.alerts.open_alerts()
    assert alert.snoozed_until is not None and alert.snoozed_until > datetime.now(UTC)
    longer = await answer(flows, f"snooze 60m {idle.text()}", me, snoozer=snoozer)
    assert "🔕 node1 GPU 1: idle-holder snoozed until" in longer  # any duration, 1h to 1d
    bad = await answer(flows, f"snooze 2d {idle.text()}", me, snoozer=snoozer)
    assert bad == "⚠ bad snooze '2d': expected a duration from 1h to 1d"
    bad = await answer(flows, "snooze 2h", me, snoozer=snoozer)
    assert bad.startswith("⚠ usage: snooze TIME KEY")
    told = await answer(flows, "help", me)
    assert "snooze TIME KEY" in told and "free KEY" in told


def test_the_console_says_what_to_type_for_an_alert_s_buttons() -> None:
    key = FindingKey("node1", 0, IDLE_HOLDER.value, "42:7").text()
    now = datetime.now(UTC)
    item = AlertItem(parse_key(key), None, now)
    text = render(render_alert_group(AlertGroup("node1", (item,), None, now)))
    assert f"[Snooze 1 h] (type: snooze 1h {key})" in text
    dm = Message(None, (Actions((free_button(key, "node1", 0, "42"),)),))
    assert f"[Free it] (type: free {key})" in render(dm)


async def test_console_process_reads_stdin(app: App, slack_fleet: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "gpubot.toml"
    text = slack_fleet.config_path.read_text()
    start = text.index('url = "', text.index("[database]"))
    cfg.write_text(
        text[:start] + f'url = "{app.settings.database_url}"' + text[text.index("\n", start) :]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpubot",
        "--config",
        str(cfg),
        "console",
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(
        proc.communicate(b"status node2\nfrobnicate\nhelp audit\naudit 5\nquit\n"), 60
    )
    assert proc.returncode == 0, err
    stdout = out.decode()
    assert "== node2 · 4 × NVIDIA H200 ==" in stdout
    assert "unknown command 'frobnicate'" in stdout
    assert "/gpu audit [NODE] [N]" in stdout
    assert "Audit log" in stdout
    bad = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpubot",
        "--config",
        str(cfg),
        "console",
        "--as",
        "alice",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(bad.communicate(), 60)
    assert bad.returncode != 0
    assert err.decode().strip().splitlines() == [
        "gpubot: error: --as 'alice': expected a Slack user id (U…/W…)"
    ]
