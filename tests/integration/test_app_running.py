"""``App.running``: the lifecycle every front end shares. It tells the start-up report through
the front end's ``Reporter`` before anything starts, runs every periodic duty the root built
(the approval expiry included), serves the metrics, and stops what it started on the way out.
The console gets the same report, printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpubot.app import App, Serving, build
from gpubot.cli.console import console_parts, identity
from gpubot.config import Settings, load
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import repl
from tests.fixtures.approvals import REQUEST


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "gpubot.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/audit.db"\n\n'
        '[[nodes]]\nname = "node3"\nhost = "127.0.0.1"\nport = 9\n'
    )
    return load(path)


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
    a = await app.store.approvals.create("U1", "alice", "node3", REQUEST, source="console")
    await app.store.approvals.decide(a.id, "U2", True, a.created_at, approver_name="bob")
    return action, a.id


async def test_the_report_comes_first_then_every_duty_runs_and_stops(settings: Settings) -> None:
    printed: list[str] = []
    serving = Serving(metrics_port=0, expire_every_s=0.05, settle_heap=False, first_after_s=3600)
    front = ConsoleFront(echo=printed.append)
    app = build(settings, {}, need_store=True, front=front, serving=serving)
    try:
        action, approval = await _interrupted(app)
        expiry = app.scheduler("approval-expiry")
        assert expiry is not None
        expired = asyncio.Event()
        started: list[bool] = []
        job = expiry.job

        async def expire() -> None:
            started.append(bool(printed))  # the report was told before any duty ran
            expired.set()
            await job()

        expiry.job = expire
        async with app.running() as run:
            await asyncio.wait_for(expired.wait(), 10)
            assert expiry.running
            running = [s.name for s in app.schedulers if s.running]
            assert running == ["sweep", "approval-expiry", "claims", "dm-due"]  # no seals: no key
            assert run.metrics_port is not None and run.metrics_port > 0
        assert started[0] is True
        assert [s.name for s in app.schedulers if s.running] == []  # stopped on the way out
        actions, approvals = printed[:2]
        assert actions.startswith("━━ Incomplete actions") and approvals.startswith(
            "━━ Incomplete approvals"
        )
        assert f"#{action} reset on node3 by U1 alice" in actions
        assert f"approval #{approval} on node3" in approvals and REQUEST.command in approvals
    finally:
        await app.close()


async def test_a_sweeps_off_replica_runs_the_other_duties_only(settings: Settings) -> None:
    serving = Serving(sweeps=False, settle_heap=False, first_after_s=3600)
    app = build(settings, {}, need_store=True, serving=serving)
    try:
        async with app.running() as run:
            assert [s.name for s in app.schedulers if s.running] == []  # no seals: no key
            assert run.metrics_port is None  # no [metrics] port, none asked for
    finally:
        await app.close()


async def test_the_console_prints_the_start_up_report_before_its_answers(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    app = build(settings, {}, need_store=True, front=ConsoleFront())
    action, approval = await _interrupted(app)
    who = identity(app.flows.svc.policy, None)
    code = await repl(console_parts(app), who, ["help"])  # closes the app
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
