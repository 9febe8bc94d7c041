"""``/gpu report`` typed at the console: the GPU-hours of the sweeps just made, as text."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, build
from gpubot.cli.console import identity
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.store import open_store


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


async def test_the_report_at_the_console(app: App, node1: Any) -> None:
    flows = app.flows
    me = identity(flows.svc.policy, "U0OWNER")
    w = node1.spawn(gpu=1, mib=4096, util_pct=60)
    assert "Sweep: " in await answer(flows, "/gpu sweep", me)
    text = await answer(flows, "/gpu report 1d by user", me)
    assert "GPU-hours by user" in text, text
    assert w.user in text and "1 sweep(s) in" in text
    nodes = await answer(flows, "report by node", me)
    assert "node1" in nodes and "free h" in nodes
    bad = await answer(flows, "report soon", me)
    assert bad.startswith("⚠ bad period 'soon'")
