"""The running bot seals its audit log (the app's one scheduler, the real store, the fake
Slack Web API): at start, at a clean stop, and after a real forced reset on the simulated
fleet, whose seal also posts the head to the alerts channel."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gpubot.app import Serving, build
from gpubot.cli.console import identity
from gpubot.config import Settings
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.store import SealRule, open_store
from tests.fixtures.audit_cut import KEY
from tests.fixtures.db import audit_rows
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import FakeSlack, assert_within_limits, slack_front
from tests.procs import alive

ENV = {"GPUBOT_AUDIT_KEY": KEY.decode()}
EXTRA: dict[str, Any] = {"slack": {"channel": "C0GENERAL"}, "alerts": {"channel": "C0ALERTS"}}


def _seals(url: str) -> list[dict[str, Any]]:
    return [json.loads(r.payload) for r in audit_rows(url) if r.kind == "seal"]


async def test_serve_seals_at_start_and_at_a_clean_stop(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    head_file = tmp_path / "audit.head"
    audit = dataclasses.replace(Settings().audit, head_file=str(head_file))
    settings = dataclasses.replace(with_tables(Settings(database_url=url), EXTRA), audit=audit)
    app = build(
        settings,
        ENV,
        need_store=True,
        front=slack_front(fake_slack),
        serving=Serving(sweeps=False, settle_heap=False, first_after_s=0),
    )
    try:
        assert app.seals is not None and app.store is not None
        assert app.reset.after_forced == app.seals.forced
        schedule = app.scheduler("audit-seal")
        assert schedule is not None and schedule.interval_s == 900.0  # [audit] seal_every
        app.start()
        await fake_slack.wait_for(lambda: bool(app.seals and app.seals.running), timeout=30)
        assert [s["seal"] for s in _seals(url)] == ["start"]
        await app.seals.forced(41)  # what a forced reset's end calls
        await fake_slack.wait_for(lambda: len(fake_slack.ok("chat.postMessage")) >= 2, timeout=30)
        heads = [c.body["text"] for c in fake_slack.ok("chat.postMessage")]
        result = await app.store.verify(seals=SealRule())
        assert result.ok, result.line()
        assert f"Audit log head {result.head}" in heads  # posted after the forced seal
    finally:
        await app.close()
    seals = _seals(url)
    assert [s["seal"] for s in seals] == ["start", "forced", "stop"]
    assert seals[1]["after"] == 41 and seals[1]["every_s"] == 900
    rows = audit_rows(url)
    assert seals[2]["prev"] == [rows[-2].seq, rows[-2].hash]  # each names what came before
    assert json.loads(head_file.read_text())["seq"] == rows[-1].seq
    assert_within_limits(fake_slack)


async def test_a_forced_reset_is_sealed_at_its_end(
    slack_settings: Any, node1: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    app = build(
        dataclasses.replace(slack_settings, database_url=url),
        ENV,
        need_store=True,
        front=ConsoleFront(),
    )
    try:
        flows = app.flows
        w = node1.spawn(gpu=3, mib=1000)
        bob = identity(flows.svc.policy, "U0BOB")
        asked = await answer(flows, "reset node1 gpu 3", bob)
        line = next(x for x in asked.splitlines() if "an approver types: approve" in x)
        approval_id = int(line.split("approve ")[1].split()[0])
        assert _seals(url) == []  # asking is not a forced action
        done = await answer(flows, f"approve {approval_id}", identity(flows.svc.policy, "U0CAROL"))
        assert "✅ freed" in done and not alive(w.pid)
    finally:
        await app.close()
    rows = audit_rows(url)
    outcome = next(r for r in rows if r.kind == "outcome" and r.data["status"] == "freed")
    [seal] = [r for r in rows if r.kind == "seal"]
    assert seal.seq > outcome.seq
    assert seal.data["seal"] == "forced" and seal.data["after"] == outcome.action_id
    assert seal.data["prev"] == [seal.seq - 1, rows[seal.seq - 2].hash]
