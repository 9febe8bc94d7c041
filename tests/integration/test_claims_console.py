"""Claims and the queue at the console and the CLI (issue 26): claim, conflict, queue,
extend, release (the first in line told), expiry; claims under status, on the Home tab, in
Prometheus; ``gpubot claim … --json`` as a real process."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import (
    App,
    Serving,
    build,
)
from gpubot.chat.flows import Flows
from gpubot.chat.message import Message
from gpubot.cli.console import identity
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer, render
from gpubot.core.claims.rules import ClaimSettings
from gpubot.store import open_store
from gpusim.node_layout import gpu_uuid
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.settings import ManualClock
from tests.procs import alive, until

CLAIMS = ClaimSettings(enabled=True, max_hours=8, hold_minutes=10)


@pytest.fixture
async def app(slack_settings: Any, tmp_path: Path) -> AsyncIterator[App]:
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    s = dataclasses.replace(slack_settings, database_url=url, claims=CLAIMS)
    serving = Serving(sweeps=False, settle_heap=False)  # serving: with its metrics
    built = build(s, {}, need_store=True, front=ConsoleFront(), serving=serving)
    yield built
    await built.close()


@pytest.fixture
def flows(app: App) -> Flows:
    return app.flows


async def test_claims_at_the_console(app: App, flows: Flows, node1: Any) -> None:
    clock = ManualClock()
    assert app.chat.claims is not None
    app.chat.claims.clock = clock
    told: list[tuple[str, str]] = []

    async def dm(user: str, msg: Message, subject: str) -> bool:
        told.append((user, render(msg)))
        return True

    flows.claims.dm = dm
    bob, dave = identity(flows.svc.policy, "U0BOB"), identity(flows.svc.policy, "U0DAVE")
    got = await answer(flows, "claim node1 any 2 for 2h sweep-lr", bob)
    assert f"CUDA_VISIBLE_DEVICES={gpu_uuid('node1', 0)},{gpu_uuid('node1', 1)}" in got
    conflict = await answer(flows, "claim node1 gpu 1 for 1h", dave)
    assert "Not claimed" in conflict and "claimed by @U0BOB (bob) until" in conflict
    assert "sweep-lr" in conflict
    assert "in line for node1 GPU 1" in await answer(flows, "wait node1 gpu 1 for 1h", dave)
    assert "@U0DAVE" in await answer(flows, "queue", bob)
    assert "now until" in await answer(flows, "extend by 1h", bob)
    status = await answer(flows, "status node1", dave)
    assert "node1 GPU 0 claimed by @U0BOB (bob) until" in status and "sweep-lr" in status
    home = render(await flows.home(bob))
    assert "Your claims" in home and "node1 GPU 1 claimed by @U0BOB" in home
    carol = identity(flows.svc.policy, "U0CAROL")
    assert "1 ahead" in await answer(flows, "wait node1 gpu 1", carol)
    assert "released: node1 GPU 1" in await answer(flows, "release node1 gpu 1", bob)
    assert [u for u, _ in told] == ["U0DAVE"] and "held for you" in told[0][1]
    clock.advance(11 * 60)  # dave lets the hold run out: carol is next
    assert await flows.claims.tick() == 2
    assert [u for u, _ in told[1:]] == ["U0DAVE", "U0CAROL"] and "ran out" in told[1][1]
    typed = re.search(r"take (\d+)", told[2][1])  # the Claim button, typed at the console
    assert typed is not None
    assert "Claimed" in await answer(flows, typed[0], carol)
    assert "holds nothing now (lapsed)" in await answer(flows, "take 1", dave)
    assert await flows.claims.tick() == 0
    metrics = app.metrics
    assert metrics is not None
    text = metrics.text()
    assert 'gpubot_gpu_claimed{gpu="0",node="node1",user="bob"} 1.0' in text
    assert 'gpubot_gpu_claimed{gpu="1",node="node1",user="carol"} 1.0' in text
    clock.advance(8 * 3600 + 1)  # bob's 3 h (extended) and carol's 8 h (max_hours) run out
    assert await flows.claims.tick() == 2  # each told their claim ended
    assert "No active claims" in await answer(flows, "claims all", bob)
    assert "gpubot_gpu_claimed{" not in metrics.text()


async def test_an_intruder_freed_at_the_console_after_approval(
    app: App, flows: Flows, node1: Any
) -> None:
    told: list[str] = []

    async def dm(user: str, msg: Message, subject: str) -> bool:
        told.append(f"{user}: {render(msg)}")
        return True

    flows.claims.dm = dm
    bob, carol = identity(flows.svc.policy, "U0BOB"), identity(flows.svc.policy, "U0CAROL")
    assert "claimed until" in await answer(flows, "claim node1 gpu 2 for 1h", bob)
    w = node1.spawn(gpu=2, mib=1500)
    await app.sweep.run(alerting=False)
    assert await flows.claims.tick() == 1
    typed = re.search(r"free-claim (\[[^\]]*\])", told[0])
    assert typed is not None and told[0].startswith("U0BOB: ")
    asked = await answer(flows, typed[0], bob)
    assert "Approval needed" in asked and "is claimed by @U0BOB (bob) since" in asked
    assert alive(w.pid)
    approval = re.search(r"approve (\d+)", asked) or re.search(r"Request #(\d+)", asked)
    assert approval is not None
    await answer(flows, f"approve {approval[1]}", carol)
    await until(lambda: not alive(w.pid), 20, "the approved kill")


def test_gpubot_claim_json(slack_fleet: Any, tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    text = Path(slack_fleet.config_path).read_text(encoding="utf-8")
    config = tmp_path / "gpubot.toml"
    text = re.sub(r'(?m)^url = "sqlite:///.*"$', f'url = "sqlite:///{db}"', text, count=1)
    users = '\n[users]\nU0BOB = "bob"\nU0DAVE = "dave"\n'
    config.write_text(text + "\n[claims]\nenabled = true\n" + users, encoding="utf-8")
    assert gpubot_cli(config, "db", "upgrade").returncode == 0
    got = gpubot_cli(
        config, "claim", "node2", "gpu", "3", "for", "90m", "eval", "--json", "--as", "U0DAVE"
    )
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["env"] == f"CUDA_VISIBLE_DEVICES={gpu_uuid('node2', 3)}"
    (c,) = doc["claimed"]
    assert (c["node"], c["gpu"], c["note"], c["end"] - c["start"]) == ("node2", 3, "eval", 5400)
    again = gpubot_cli(config, "claim", "node2", "gpu", "3", "for", "1h", "--json", "--as", "U0BOB")
    assert again.returncode == 1 and json.loads(again.stdout)["held"][0]["gpu"] == 3
    listed = json.loads(gpubot_cli(config, "claim", "claims", "all", "--json").stdout)
    assert [x["gpu"] for x in listed["claims"]] == [3]
    status = json.loads(gpubot_cli(config, "status", "node2", "--json").stdout)
    assert (
        status["claims"][0]["text"].startswith("claimed by ")
        and "· eval" in status["claims"][0]["text"]
    )
    bad = gpubot_cli(config, "claim", "node2", "gpu", "3", "for", "4x")
    assert bad.returncode == 2 and "bad duration '4x'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    gone = gpubot_cli(config, "claim", "release", "--json", "--as", "U0DAVE")
    assert gone.returncode == 0 and json.loads(gone.stdout)["released"][0]["gpu"] == 3


async def test_a_release_stands_when_its_node_cannot_be_asked(flows: Flows, node1: Any) -> None:
    """The release is written (and audited) before the queue is served; a node whose
    nvidia-smi fails just then must not make the answer an error (the control: the queue
    is served at once when the node answers, ``test_claims_at_the_console``)."""
    bob, dave = identity(flows.svc.policy, "U0BOB"), identity(flows.svc.policy, "U0DAVE")
    assert "claimed until" in await answer(flows, "claim node1 gpu 2 for 1h", bob)
    assert "in line" in await answer(flows, "wait node1 gpu 2", dave)
    node1.set_fault("driver-error")
    said = await answer(flows, "release node1", bob)
    assert "released" in said.lower() and "⚠" not in said, said
    assert "claimed by" not in await answer(flows, "claims node1", bob)
