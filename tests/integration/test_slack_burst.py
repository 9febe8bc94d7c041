"""A burst of ``/gpu status all``: one probe round, one render, one HTTP session, every request
audited. Real parts: the simulated fleet over SSH, the SQLite audit store, signed HTTP into the
bolt app, the loopback fake of the Slack Web API; the probes are held at a gate until every
request has joined, so "concurrent" does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from benchmarks import slack_ack
from gpubot.config import Settings
from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.ports import Transport
from gpubot.services.status import FleetStatus, StatusService
from gpubot.store import open_store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.slack import FakeSlack, assert_within_limits, running_bot

USERS = ("U0BOB", "U0CAROL", "U0DAVE", "U0EVE", "U0OWNER")  # known to the Slack tests' policy


class Gate:
    """Counts the probes of ``transport`` and holds them until ``open``; counts the callers of
    ``status.fleet`` and says when ``expect`` of them are in (each has joined a round then:
    ``fleet`` runs without a pause up to the round it joins)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        status: StatusService,
        transport: Transport,
        expect: int,
    ) -> None:
        self.runs: list[str] = []
        self.entered = 0
        self.open = asyncio.Event()
        self.joined = asyncio.Event()
        real_run, real_fleet = transport.run, status.fleet

        async def run(node: NodeConfig, argv: Sequence[str], **kw: Any) -> CommandResult:
            self.runs.append(node.name)
            await self.open.wait()
            return await real_run(node, argv, **kw)

        async def fleet(*args: Any, **kw: Any) -> FleetStatus:
            self.entered += 1
            if self.entered >= expect:
                self.joined.set()
            return await real_fleet(*args, **kw)

        monkeypatch.setattr(transport, "run", run)
        monkeypatch.setattr(status, "fleet", fleet)

    async def release_when_joined(self) -> None:
        """Wait until every expected caller is in, then let the probes go."""
        await asyncio.wait_for(self.joined.wait(), 60)
        self.open.set()


async def test_concurrent_fleet_calls_share_one_round_and_each_is_audited(
    slack_settings: Settings,
    slack_fleet: SimFleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = sorted(n.name for n in slack_fleet.nodes)
    transport = make_transport(slack_settings.ssh)
    with temp_database("sqlite", tmp_path) as url:
        store = open_store(url)
        status = StatusService(slack_settings, transport, store)
        gate = Gate(monkeypatch, status, transport, len(USERS))
        try:
            calls = [status.fleet(["all"], actor=u, source="test") for u in USERS]
            answers, _ = await asyncio.gather(asyncio.gather(*calls), gate.release_when_joined())
            assert sorted(gate.runs) == nodes  # one probe per node, not one per caller
            assert all(a is answers[0] for a in answers)  # the same answer object for all
            assert answers[0].ok and len(answers[0].snapshots) == len(nodes)
            records = await store.queries(limit=100)
            assert sorted(r.actor for r in records) == sorted(USERS)  # one record per caller
            assert {r.source for r in records} == {"test"}
            for r in records:
                assert json.loads(r.payload)["nodes"] == nodes

            again = await status.fleet(["all"], actor="U0BOB", source="test")
            assert sorted(gate.runs) == sorted(nodes * 2)  # after the round: a new round
            assert again is not answers[0] and again.ok
            assert len(await store.queries(limit=100)) == len(USERS) + 1
        finally:
            await transport.close()
            store.close()


async def test_a_caller_giving_up_does_not_stop_the_round_for_the_others(
    slack_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = make_transport(slack_settings.ssh)
    status = StatusService(slack_settings, transport)
    gate = Gate(monkeypatch, status, transport, 2)
    try:
        quitter = asyncio.create_task(status.fleet(["all"]))
        stayer = asyncio.create_task(status.fleet(["all"]))
        await asyncio.wait_for(gate.joined.wait(), 60)
        quitter.cancel()
        gate.open.set()
        answer = await stayer
        assert answer.ok and len(answer.snapshots) == len(slack_settings.nodes)
        assert quitter.cancelled()
    finally:
        await transport.close()


class PeerSlack(FakeSlack):
    """The fake Slack, also noting the TCP connection (client address) of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[Any] = []

    async def _api(self, request: web.Request) -> web.Response:
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        return await super()._api(request)

    async def _response(self, request: web.Request) -> web.Response:
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        return await super()._response(request)


async def test_a_slack_burst_is_probed_once_rendered_once_over_one_session(
    slack_settings: Settings,
    slack_fleet: SimFleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpubot.chat.fleet_view as fleet_view

    renders: list[str] = []
    real_render = fleet_view.render_fleet

    def counting_render(*args: Any, **kw: Any) -> Any:
        renders.append(str(kw.get("title")))
        return real_render(*args, **kw)

    monkeypatch.setattr(fleet_view, "render_fleet", counting_render)
    fake = PeerSlack()
    await fake.start()
    try:
        async with running_bot(slack_settings, fake, f"sqlite:///{tmp_path}/audit.db") as h:
            api = h.bot.api
            gate = Gate(monkeypatch, h.app.status, h.app.status.transport, len(USERS))
            replies, _ = await asyncio.gather(
                asyncio.gather(*(h.send.command("status all", user=u) for u in USERS)),
                gate.release_when_joined(),
            )
            assert [r.status for r in replies] == [200] * len(USERS)
            await h.settle()

            # (a) one probe per node for the whole burst; each request audited as its sender
            assert sorted(gate.runs) == sorted(n.name for n in slack_fleet.nodes)
            records = await h.store.queries(limit=100)
            assert sorted((r.actor, r.source) for r in records) == [(u, "slack") for u in USERS]
            # (b) one render, the same answer in every requester's message
            assert renders == ["GPU status · all"]
            finals = [c.body for c in fake.ok("chat.update")]
            assert len(finals) == len(USERS)
            assert all(f["blocks"] == finals[0]["blocks"] for f in finals)
            assert "GPU status · all" in finals[0]["text"]
            # (c) one session for every Web API call; a later request opens no new connection
            assert api is not None and api.pool is not None
            shared = api.client.session
            assert shared is not None and shared is api.pool.get()
            burst_peers = set(fake.peers)
            assert None not in burst_peers
            assert len(burst_peers) <= len(USERS) < len(fake.peers)
            before = len(fake.peers)
            assert (await h.send.command("status node1", user="U0BOB")).status == 200
            await h.settle()
            assert len(fake.peers) > before
            assert set(fake.peers[before:]) <= burst_peers  # kept-alive connections reused
            assert api.pool.made == 1 and api.client.session is shared
            assert_within_limits(fake)
        assert shared.closed and api.client.session is None  # closed with the app, for good
    finally:
        await fake.stop()


async def test_the_benchmark_reads_the_bots_loop_stalls(
    slack_fleet: SimFleet, tmp_path: Path
) -> None:
    config = slack_ack.write_config(slack_fleet, tmp_path)
    result = await slack_ack.burst(config, 2, 60, spacing_s=0.05)
    assert result.bad == result.busy_bad == [] and result.answered == 4
    # ``gpubot serve`` watches its loop and serves the gauge; the watch has woken late at least
    # a little (a timer never fires exactly on time)
    assert result.max_stall_s is not None and result.max_stall_s > 0
    assert result.stalls_over_50ms is not None and result.stalls_over_50ms >= 0
