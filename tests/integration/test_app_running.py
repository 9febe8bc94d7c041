"""``App.running``: the lifecycle every front end shares. It tells the start-up report through
the ``Reporter`` port before anything starts, runs every periodic duty on the one scheduler
(the approval expiry included), serves the metrics, and stops what it started on the way out.
The console gets the same report, printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpubot.app import App, Serving, build
from gpubot.chat.flows import Flows
from gpubot.cli.console import console_parts, identity, make_flows
from gpubot.config import Settings, load
from gpubot.console.repl import repl
from gpubot.core.report import Report
from tests.fixtures.approvals import REQUEST


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n\n'
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'
    )
    return load(path)


class Told:
    """A ``Reporter`` that keeps what it was told."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def report(self, report: Report) -> None:
        self.reports.append(report)


async def _interrupted(app: App) -> tuple[int, int]:
    """Leave an action without an outcome and an approval approved with no end."""
    assert app.store is not None
    action = await app.store.begin_action(
        kind="reset",
        actor="U1 alice",
        source="slack",
        command="/gpu reset node3 gpu 1",
        node="node3",
        gpus=[1],
        plan={"targets": []},
    )
    a = await app.store.approvals.create("U1", "alice", "node3", REQUEST)
    await app.store.approvals.decide(a.id, "U2", True, a.created_at, approver_name="bob")
    return action, a.id


async def test_the_report_comes_first_then_every_schedule_runs_and_stops(
    settings: Settings,
) -> None:
    app = build(settings, {}, need_store=True, serving=True, first_after_s=3600)
    try:
        action, approval = await _interrupted(app)
        told = Told()
        expired = asyncio.Event()
        started: list[bool] = []

        async def expire() -> None:
            started.append(bool(told.reports))  # the report was told before any schedule ran
            expired.set()

        options = Serving(metrics_port=0, expire_every_s=0.05, settle_heap=False)
        async with app.running(told, options=options, expire=expire) as run:
            await asyncio.wait_for(expired.wait(), 10)
            schedule = app.scheduler("approval-expiry")
            assert schedule is not None and schedule.running
            assert {s.name for s in app.schedulers if s.running} >= {"sweep", "approval-expiry"}
            assert run.metrics_port is not None and run.metrics_port > 0
        assert started[0] is True
        assert [s.name for s in app.schedulers if s.running] == []  # stopped on the way out
        assert [r.title for r in told.reports] == ["Incomplete actions", "Incomplete approvals"]
        actions, approvals = (r.text() for r in told.reports)
        assert f"#{action} reset on node3 by U1 alice" in actions
        assert f"approval #{approval} on node3" in approvals and REQUEST.command in approvals
    finally:
        await app.close()


async def test_a_sweeps_off_replica_runs_the_other_schedules_only(settings: Settings) -> None:
    app = build(settings, {}, need_store=True, serving=True, first_after_s=3600)
    try:
        async with app.running(options=Serving(sweeps=False, settle_heap=False)) as run:
            assert [s.name for s in app.schedulers if s.running] == []  # no seals: no key
            assert run.metrics_port is None  # no [metrics] port, none asked for
    finally:
        await app.close()


async def test_the_console_prints_the_start_up_report_before_its_answers(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    app = build(settings, {}, need_store=True)
    action, approval = await _interrupted(app)
    flows: Flows = make_flows(app)
    code = await repl(
        console_parts(app, flows), identity(flows.svc.policy, None), ["help"]
    )  # closes the app
    out = capsys.readouterr().out
    assert code == 0
    assert out.index("━━ Incomplete actions") < out.index("━━ Incomplete approvals")
    assert out.index("━━ Incomplete approvals") < out.index("/gpu status")  # then the answer
    assert f"#{action} reset on node3" in out and f"approval #{approval} on node3" in out
    again = build(settings, {}, need_store=True)
    assert again.store is not None
    marked = await again.store.approvals.get(approval)
    await again.close()
    assert marked is not None and marked.state == "incomplete"
