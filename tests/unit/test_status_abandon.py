"""``StatusService.abandon``: a round of probes that its caller gave up on (a ``--watch`` ended by
SIGTERM) is shielded, so it would go on while the app closes the transport under it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpubot.core.models import CommandResult, NodeConfig
from gpubot.services.status import StatusService
from tests.fixtures.recorded import recorded, settings


class Hanging:
    """A transport whose commands never answer; says whether any was still running at close."""

    def __init__(self) -> None:
        self.running = 0
        self.running_at_close = -1

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        self.running += 1
        try:
            await asyncio.Event().wait()
            raise AssertionError("never answered")
        finally:
            self.running -= 1

    async def close(self) -> None:
        self.running_at_close = self.running


async def _caller_gives_up(status: StatusService, transport: Hanging) -> None:
    caller = asyncio.ensure_future(status.fleet(["all"]))
    while transport.running < 2:
        await asyncio.sleep(0)
    caller.cancel()  # what --watch does on SIGTERM
    await asyncio.gather(caller, return_exceptions=True)


async def test_abandon_ends_the_round_before_the_transport_closes() -> None:
    prefix, _ = recorded("sim-idle")
    transport = Hanging()
    status = StatusService(settings(prefix), transport)
    await _caller_gives_up(status, transport)
    await status.abandon()
    await transport.close()
    assert transport.running_at_close == 0


async def test_control_without_abandon_the_round_still_runs_at_close() -> None:
    prefix, _ = recorded("sim-idle")
    transport = Hanging()
    status = StatusService(settings(prefix), transport)
    await _caller_gives_up(status, transport)
    await transport.close()
    assert transport.running_at_close == 2  # both nodes' probes, shielded from the caller
    await status.abandon()  # tidy up
